// Linear layers on Q4_1 codes (the GGUF's own 4-bit weights, exactly) against int8 activations,
// for the few rows of a decode step: VPDPBUSD multiplies the unsigned 4-bit codes by the signed
// int8 activations directly, 64 products per instruction, where the bf16 path (quant_linear.cpp)
// turns every code into a bf16 first and then is bound by that arithmetic, not by the bytes.
//
//   weights: w[n, k] = d[n, g] * q[n, k] + m[n, g], q in 0..15 (Q4_1, groups g of 32 inputs)
//   activations: x[m, k] ~ dx[m, g] * qx[m, k] (int8_activations.h)
//   out[m, n] = sum_g dx[m, g] * (d[n, g] * sum_{k in g} q[n, k] qx[m, k] + m[n, g] * sum_{k in g} qx[m, k])
//
// that is, the exact weights times the int8-rounded activations, in float32; the integer dots
// are exact in int32, the sums over groups run in order, so a row's result does not depend on
// the batch it is in.
//
// Layout (engine/models/gguf_codes.py GroupCodes.int8_tiles): 16 outputs by one group of 32
// inputs are 256 bytes, four vectors of 64; byte b of vector t holds output b / 4 at input
// 4t + b % 4 in its low nibble and at input 4(t + 4) + b % 4 in its high one, so a mask and a
// shift give the 16 x 4 codes that one VPDPBUSD takes against 4 activations broadcast.
//   codes uint8 [N/16, K/32, 4, 64]; scales, mins float16 [N/16, K/32, 16]
#include "aten.h"

#include "int8_activations.h"
#include "kernels.h"
#include "parallel.h"
#include "with_rows.h"

#include <cstdint>

namespace {

constexpr int64_t kGroup = llm_serve::kActivationGroup;
constexpr int64_t kOutputs = 16;     // per tile
constexpr int64_t kTileBytes = 256;  // codes of one tile and group
constexpr int kMaxRows = 4;          // rows per pass over a tile's codes

#if defined(__AVX512VNNI__)
// Rows r0..r0+R of the 16 outputs of tile `tile`
template <int R, typename Out>
void tile_rows(const llm_serve::Activations& a, const uint8_t* codes, const at::Half* scales, const at::Half* mins,
               int64_t K, int64_t tile, int64_t r0, Out* out, int64_t N) {
  const int64_t G = K / kGroup;
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const uint8_t* c = codes + tile * G * kTileBytes;
  const at::Half* d = scales + tile * G * kOutputs;
  const at::Half* m = mins + tile * G * kOutputs;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t ahead = 0; ahead < kTileBytes; ahead += 64)
      _mm_prefetch(reinterpret_cast<const char*>(c + (g + 4) * kTileBytes + ahead), _MM_HINT_T0);
    __m512i q[8];  // inputs 4t..4t+3 of group g for the 16 outputs
    for (int t = 0; t < 4; ++t) {
      const __m512i v = _mm512_loadu_si512(c + g * kTileBytes + 64 * t);
      q[t] = _mm512_and_si512(v, nibble);
      q[t + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
    }
    const __m512 dg = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(d + g * kOutputs)));
    const __m512 mg = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(m + g * kOutputs)));
    for (int r = 0; r < R; ++r) {
      const int8_t* xq = a.q.data() + (r0 + r) * K + g * kGroup;
      __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();  // two chains
      for (int t = 0; t < 8; t += 2) {
        int32_t four[2];
        __builtin_memcpy(four, xq + 4 * t, sizeof(four));
        even = _mm512_dpbusd_epi32(even, q[t], _mm512_set1_epi32(four[0]));
        odd = _mm512_dpbusd_epi32(odd, q[t + 1], _mm512_set1_epi32(four[1]));
      }
      const int64_t rg = (r0 + r) * G + g;
      const float dx = a.scale[rg];
      const float qx_sum = static_cast<float>(-a.offset[rg] / 128);
      const __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(even, odd));
      // dx * (d * dot + m * sum qx): the products as the formula above orders them
      const __m512 group = _mm512_fmadd_ps(dg, dot, _mm512_mul_ps(mg, _mm512_set1_ps(qx_sum)));
      acc[r] = _mm512_fmadd_ps(group, _mm512_set1_ps(dx), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) llm_serve::store16(out + (r0 + r) * N + tile * kOutputs, acc[r]);
}

#elif defined(LLM_SERVE_INT8_DOT)
// The AVX2 form: VPMADDUBSW multiplies the unsigned codes by the int8 activations into int16 pair
// sums, which add up over the whole group in int16 (eight pair sums of at most 2 x 15 x 127 each:
// 30,480 < 32,767), and one VPMADDWD per group turns them into int32: 18 multiplying instructions
// per row and group of 16 x 32 products where the int8 weights (int8_linear.cpp) take 32, the
// multiplier ports being what bounds both at a batch's row counts. The same integer dots as
// VPDPBUSD's, then the same float32 arithmetic, so the results are the VNNI tier's bitwise.
//
// Registers: a row's int16 sums of both halves (outputs 0..7, 8..15) for R = 4 rows are 8 of the 16,
// one code vector's two halves unpacked 4 more, the two broadcast activations and the mask the
// rest; the float32 sums live in L1, touched once per group. Empty asm statements keep the int16
// sums in their registers: otherwise GCC regroups the integer additions over the code vectors,
// holds every product at once and spills them to the stack.
template <int R, typename Out>
void tile_rows(const llm_serve::Activations& a, const uint8_t* codes, const at::Half* scales, const at::Half* mins,
               int64_t K, int64_t tile, int64_t r0, Out* out, int64_t N) {
  const int64_t G = K / kGroup;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  alignas(32) float acc[R][kOutputs] = {};
  const uint8_t* c = codes + tile * G * kTileBytes;
  const at::Half* d = scales + tile * G * kOutputs;
  const at::Half* m = mins + tile * G * kOutputs;
  const int8_t* xq = a.q.data() + r0 * K;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t ahead = 0; ahead < kTileBytes; ahead += 64)
      _mm_prefetch(reinterpret_cast<const char*>(c + (g + 4) * kTileBytes + ahead), _MM_HINT_T0);
    __m256i sums[R][2];  // int16 pair sums of outputs 0..7, 8..15
    for (int r = 0; r < R; ++r) sums[r][0] = sums[r][1] = _mm256_setzero_si256();
    for (int t = 0; t < 4; ++t) {
      __m256i low[2], high[2];  // inputs 4t..4t+3 and 4(t+4)..4(t+4)+3 of the 16 outputs
      for (int h = 0; h < 2; ++h) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + g * kTileBytes + 64 * t + 32 * h));
        low[h] = _mm256_and_si256(v, nibble);
        high[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
      }
      for (int r = 0; r < R; ++r) {
        const int8_t* x = xq + r * K + g * kGroup;
        int32_t four[2];
        __builtin_memcpy(&four[0], x + 4 * t, sizeof(int32_t));
        __builtin_memcpy(&four[1], x + 4 * (t + 4), sizeof(int32_t));
        const __m256i x_low = _mm256_set1_epi32(four[0]), x_high = _mm256_set1_epi32(four[1]);
        for (int h = 0; h < 2; ++h) {
          sums[r][h] = _mm256_add_epi16(sums[r][h], _mm256_add_epi16(_mm256_maddubs_epi16(low[h], x_low),
                                                                     _mm256_maddubs_epi16(high[h], x_high)));
          __asm__("" : "+x"(sums[r][h]));
        }
      }
    }
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 dg[2], mg[2];
    for (int h = 0; h < 2; ++h) {
      dg[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d + g * kOutputs + 8 * h)));
      mg[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m + g * kOutputs + 8 * h)));
    }
    for (int r = 0; r < R; ++r) {
      const int64_t rg = (r0 + r) * G + g;
      const __m256 qx_sum = _mm256_set1_ps(static_cast<float>(-a.offset[rg] / 128)), dx = _mm256_set1_ps(a.scale[rg]);
      for (int h = 0; h < 2; ++h) {
        const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(sums[r][h], ones));
        // dx * (d * dot + m * sum qx), as the VNNI form orders it
        const __m256 group = _mm256_fmadd_ps(dg[h], dot, _mm256_mul_ps(mg[h], qx_sum));
        _mm256_store_ps(acc[r] + 8 * h, _mm256_fmadd_ps(group, dx, _mm256_load_ps(acc[r] + 8 * h)));
      }
    }
  }
  for (int r = 0; r < R; ++r) llm_serve::store16(out + (r0 + r) * N + tile * kOutputs, llm_serve::load16(acc[r]));
}
#endif

#if defined(LLM_SERVE_INT8_DOT)
template <typename In, typename Out>
void run(const In* x, const uint8_t* codes, const at::Half* scales, const at::Half* mins, int64_t M, int64_t K,
         int64_t N, Out* out) {
  // a thread takes whole tiles; a tile's codes (K / 2 x 16 bytes) stay in L1/L2 over its rows
  llm_serve::with_own_activations<kGroup>(x, M, K, N / kOutputs, 2,
                                  [&](const llm_serve::Activations& a, int64_t lo, int64_t hi) {
    for (int64_t tile = lo; tile < hi; ++tile) {
      int64_t r = 0;
      for (; r + kMaxRows <= M; r += kMaxRows) tile_rows<kMaxRows>(a, codes, scales, mins, K, tile, r, out, N);
      if (r < M) {
        llm_serve::with_rows<kMaxRows - 1>(static_cast<int>(M - r), [&](auto rows) {
          tile_rows<decltype(rows)::value>(a, codes, scales, mins, K, tile, r, out, N);
        });
      }
    }
  });
}
#endif

}  // namespace

bool q4_int8_linear_available() {
#if defined(LLM_SERVE_INT8_DOT)
  return true;
#else
  return false;
#endif
}

at::Tensor q4_int8_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                          const at::Tensor& mins, bool float32_out) {
  TORCH_CHECK(q4_int8_linear_available(), "q4_int8_linear needs AVX512-VNNI or AVX2 (this is the scalar tier)");
  llm_serve::check_int8_input(x);
  [[maybe_unused]] const int64_t M = x.size(0);
  const int64_t K = x.size(1);
  TORCH_CHECK(codes.is_contiguous() && codes.scalar_type() == at::kByte && codes.dim() == 4 &&
                  codes.size(1) == K / kGroup && codes.size(2) == 4 && codes.size(3) == 64,
              "codes: uint8 [out/16, in/32, 4, 64], contiguous");
  const int64_t N = codes.size(0) * kOutputs;
  for (const at::Tensor* t : {&scales, &mins})
    TORCH_CHECK(t->is_contiguous() && t->scalar_type() == at::kHalf && t->numel() == N * (K / kGroup),
                "scales, mins: float16 [out/16, in/32, 16], contiguous");
  return llm_serve::run_int8_kernel(x, N, float32_out, [&](const auto* xp, auto* out) {
#if defined(LLM_SERVE_INT8_DOT)
    run(xp, codes.data_ptr<uint8_t>(), scales.data_ptr<at::Half>(), mins.data_ptr<at::Half>(), M, K, N, out);
#endif
  });
}
