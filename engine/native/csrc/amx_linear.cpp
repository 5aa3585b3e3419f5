// Linear layers for batches on Intel AMX: the GGUF's Q4_1 / Q8_0 codes de-quantized into bfloat16
// weight tiles next to the matrix unit, so a step of many rows reads the codes (a third of bf16's
// bytes) and still runs at the matrix unit's rate.
//
// The weights a tile holds are exactly the dense path's: w = d * q + m (Q4_1) or d * q (Q8_0) in
// float32 (exact: an fp16 d times a code of at most 8 bits), rounded to bfloat16 (nearest even), as
// GroupCodes.dequantize().to(bfloat16) rounds them. TDPBF16PS multiplies them by the bf16 inputs
// and adds in float32; out is float32 (logits) or x's dtype.
//
// Layout ("amx tiles", engine/models/gguf_codes.py packs them), per 16 outputs and group of 32
// inputs: a B tile of 16 rows, row p the input pair (2p, 2p + 1) of every output, in TDPBF16PS's
// order (word 2c + i = output c at input 2p + i). A row's 32 words are made from two vectors of
// 16 float32 lanes: "low" (lanes 2c + i for outputs c = 0..7) and "high" (outputs 8..15), as
// VCVTNE2PS2BF16 joins them.
//   Q4_1 codes  uint8 [N/16, K/32, 16, 16]: byte j of row p holds low lane j's code in its low
//               nibble and high lane j's in its high nibble
//   Q8_0 codes  int8  [N/16, K/32, 16, 32]: row p's low lanes' codes, then its high lanes'
//   scales, mins float16 [N/16, K/32, 16] (mins: Q4_1 only)
// x [M, K] bfloat16 (K a multiple of 32), out [M, N] (N a multiple of 32).
//
// Every output's sum over K runs in the same tile instructions whatever the other rows are, so a
// row's result does not depend on the batch it is in.
#include <ATen/ATen.h>

#include "amx_tiles.h"
#include "parallel.h"
#include "vec16.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kGroup = 32;
constexpr int64_t kTileN = 16;    // outputs per B tile
constexpr int64_t kTileM = 16;    // rows per A and C tile
constexpr int64_t kTileBytes = 1024;  // 16 rows x 64 bytes: every tile here
constexpr int64_t kPrefetchTiles = 24;
constexpr int64_t kDequantizeAhead = 1;
constexpr int64_t kRing = kDequantizeAhead + 1;  // groups of B tiles in flight

#if defined(LLM_SERVE_AMX)
using llm_serve::configure_tiles;
using llm_serve::request_amx;
using llm_serve::round_to;
using llm_serve::silu_mul16;
using llm_serve::store16;

// tiles 0, 1: A (rows 0-15 and 16-31 of a chunk); 2, 3: B (two sets of 16 outputs); 4-7: C
enum class Format { kQ4_1, kQ8_0 };

// Lanes 2c + i of the low vector are outputs c = 0..7, of the high one 8..15: a tile's 16
// float32 scales (or mins) spread to the two.
inline void spread(const at::Half* p, __m512& low, __m512& high) {
  const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const __m512i lo_idx = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  low = _mm512_permutexvar_ps(lo_idx, v);
  high = _mm512_permutexvar_ps(_mm512_add_epi32(lo_idx, _mm512_set1_epi32(8)), v);
}

// One B tile (16 outputs x one group) de-quantized into `tile` (1024 bytes)
template <Format F>
inline void dequantize_tile(const uint8_t* codes, const at::Half* scales, const at::Half* mins, uint8_t* tile) {
  __m512 d_lo, d_hi, m_lo = _mm512_setzero_ps(), m_hi = _mm512_setzero_ps();
  spread(scales, d_lo, d_hi);
  if constexpr (F == Format::kQ4_1) spread(mins, m_lo, m_hi);
  for (int p = 0; p < 16; ++p) {
    __m512 lo, hi;
    if constexpr (F == Format::kQ4_1) {
      const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + p * 16)));
      lo = _mm512_fmadd_ps(d_lo, _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(0x0F))), m_lo);
      hi = _mm512_fmadd_ps(d_hi, _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4)), m_hi);
    } else {
      const auto* q = reinterpret_cast<const __m128i*>(codes + p * 32);
      lo = _mm512_mul_ps(d_lo, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q))));
      hi = _mm512_mul_ps(d_hi, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1))));
    }
    _mm512_store_si512(tile + p * 64, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
  }
}

template <Format F, bool Gated, typename Out>
void amx_linear_impl(const at::BFloat16* x, int64_t M, int64_t K, const uint8_t* codes, const at::Half* scales,
                     const at::Half* mins, Out* out, int64_t N) {
  const int64_t G = K / kGroup, tile_code_bytes = F == Format::kQ4_1 ? 256 : 512;
  const int64_t pairs = N / (2 * kTileN);
  // rows in chunks of 32 (two A tiles); a last chunk's missing rows read zeros from a padded copy
  const int64_t padded_m = (M + kTileM - 1) / kTileM * kTileM;
  std::vector<at::BFloat16> x_padded;
  const at::BFloat16* xa = x;
  if (padded_m != M) {
    x_padded.assign(padded_m * K, at::BFloat16(0.f));
    std::copy(x, x + M * K, x_padded.begin());
    xa = x_padded.data();
  }
  const int64_t x_stride = K * static_cast<int64_t>(sizeof(at::BFloat16));
  llm_serve::parallel_chunks(0, pairs, 1, [&](llm_serve::Chunks& chunks) {
    configure_tiles();
    // this pair's two sets of 16 outputs de-quantized: over the whole K ([2][G] tiles) where later
    // rows read them again; for one chunk of rows, a ring of the groups in flight ([kRing][2]),
    // which stays in L1 beside x
    const bool ring = padded_m <= 2 * kTileM;
    std::vector<uint8_t> storage((ring ? 2 * kRing : 2 * G) * kTileBytes + 64);
    uint8_t* b = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(storage.data()) + 63) & ~uintptr_t{63});
    const auto b_tile = [&](int s, int64_t g) {
      return b + (ring ? (g % kRing) * 2 + s : s * G + g) * kTileBytes;
    };
    alignas(64) float c[4][kTileM * kTileN];
    // one pair of 16-output tiles over every row
    const auto run_pair = [&](int64_t pair) {
      const auto dequantize_group = [&](int64_t g) {
        for (int s = 0; s < 2; ++s) {
          const int64_t tile = (Gated ? pair + s * pairs : 2 * pair + s) * G + g;
          const uint8_t* ahead = codes + (tile + kPrefetchTiles) * tile_code_bytes;
          for (int64_t off = 0; off < tile_code_bytes; off += 64)
            _mm_prefetch(reinterpret_cast<const char*>(ahead + off), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(scales + (tile + kPrefetchTiles) * kTileN), _MM_HINT_T0);
          if constexpr (F == Format::kQ4_1)
            _mm_prefetch(reinterpret_cast<const char*>(mins + (tile + kPrefetchTiles) * kTileN), _MM_HINT_T0);
          dequantize_tile<F>(codes + tile * tile_code_bytes, scales + tile * kTileN,
                             F == Format::kQ4_1 ? mins + tile * kTileN : nullptr, b_tile(s, g));
        }
      };
      // each group's tiles de-quantized one group before the matrix unit first takes them (for the
      // first 32 rows), so the vector units make the next group's while the tile multiplies run and
      // a tile load never waits for the stores that made its tile; later rows read them from the
      // buffer
      for (int64_t m0 = 0; m0 < padded_m; m0 += 2 * kTileM) {
        const bool two = m0 + kTileM < padded_m;
        _tile_zero(4);
        _tile_zero(5);
        _tile_zero(6);
        _tile_zero(7);
        const at::BFloat16* a0 = xa + m0 * K;
        if (m0 == 0)
          for (int64_t g = 0; g < std::min<int64_t>(kDequantizeAhead, G); ++g) dequantize_group(g);
        for (int64_t g = 0; g < G; ++g) {
          if (m0 == 0 && g + kDequantizeAhead < G) dequantize_group(g + kDequantizeAhead);
          _tile_loadd(0, a0 + g * kGroup, x_stride);
          _tile_loadd(2, b_tile(0, g), 64);
          _tile_loadd(3, b_tile(1, g), 64);
          _tile_dpbf16ps(4, 0, 2);
          _tile_dpbf16ps(5, 0, 3);
          if (two) {
            _tile_loadd(1, a0 + kTileM * K + g * kGroup, x_stride);
            _tile_dpbf16ps(6, 1, 2);
            _tile_dpbf16ps(7, 1, 3);
          }
        }
        _tile_stored(4, c[0], 64);
        _tile_stored(5, c[1], 64);
        _tile_stored(6, c[2], 64);
        _tile_stored(7, c[3], 64);
        if constexpr (Gated) {  // silu(gate) * up: tiles 2rb (gate) and 2rb + 1 (up) of row block rb
          for (int rb = 0; rb < (two ? 2 : 1); ++rb)
            for (int64_t r = 0; r < kTileM && m0 + rb * kTileM + r < M; ++r) {
              const __m512 gate = round_to<at::BFloat16>(_mm512_load_ps(c[2 * rb] + r * kTileN));
              const __m512 up = round_to<at::BFloat16>(_mm512_load_ps(c[2 * rb + 1] + r * kTileN));
              store16(out + (m0 + rb * kTileM + r) * (N / 2) + pair * kTileN, silu_mul16<at::BFloat16>(gate, up));
            }
        } else {
          for (int t = 0; t < (two ? 4 : 2); ++t) {
            const int64_t r0 = m0 + (t / 2) * kTileM, n0 = (2 * pair + t % 2) * kTileN;
            for (int64_t r = 0; r < kTileM && r0 + r < M; ++r) {
              Out* dst = out + (r0 + r) * N + n0;
              const float* src = c[t] + r * kTileN;
              if constexpr (std::is_same_v<Out, float>)
                _mm512_storeu_ps(dst, _mm512_load_ps(src));
              else
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                                    reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_load_ps(src))));
            }
          }
        }
      }
    };
    int64_t lo, hi;
    while (chunks.next(lo, hi))
      for (int64_t pair = lo; pair < hi; ++pair) run_pair(pair);
    _tile_release();
  });
}
#endif

}  // namespace

bool amx_linear_available() {
#if defined(LLM_SERVE_AMX)
  return request_amx();
#else
  return false;
#endif
}

namespace {
// the checks both entry points make; q4: the format is Q4_1
bool check_amx_inputs(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                      const std::string& format) {
  TORCH_CHECK(amx_linear_available(), "amx_linear: this build or CPU has no AMX-BF16");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(), "x: contiguous bf16 [rows, in]");
  TORCH_CHECK(format == "q4_1" || format == "q8_0", "format q4_1 or q8_0");
  const bool q4 = format == "q4_1";
  TORCH_CHECK(codes.dim() == 4 && codes.is_contiguous() && scales.is_contiguous() && scales.dim() == 3,
              "codes [out/16, in/32, 16, 16 or 32], scales [out/16, in/32, 16]");
  TORCH_CHECK(x.size(1) == codes.size(1) * kGroup && codes.size(3) == (q4 ? 16 : 32) &&
                  codes.size(0) * kTileN % (2 * kTileN) == 0,
              "codes do not match x, or outputs not a multiple of 32");
  TORCH_CHECK(!q4 || (mins.is_contiguous() && mins.sizes() == scales.sizes()), "q4_1 needs mins like scales");
  return q4;
}

// amx_linear_impl for the format the inputs checked to; out [M, N] (Gated: [M, N / 2])
template <bool Gated, typename Out>
void run_amx(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins, bool q4,
             Out* out) {
#if defined(LLM_SERVE_AMX)
  const int64_t M = x.size(0), K = x.size(1), N = codes.size(0) * kTileN;
  const auto* c = static_cast<const uint8_t*>(codes.data_ptr());
  const auto* s = scales.data_ptr<at::Half>();
  const at::Half* mn = q4 ? mins.data_ptr<at::Half>() : nullptr;
  const auto* xp = x.data_ptr<at::BFloat16>();
  if (q4) amx_linear_impl<Format::kQ4_1, Gated>(xp, M, K, c, s, mn, out, N);
  else amx_linear_impl<Format::kQ8_0, Gated>(xp, M, K, c, s, mn, out, N);
#endif
}
}  // namespace

at::Tensor amx_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                      const std::string& format, bool float32_out) {
  const bool q4 = check_amx_inputs(x, codes, scales, mins, format);
  auto out = at::empty({x.size(0), codes.size(0) * kTileN}, x.options().dtype(float32_out ? at::kFloat : at::kBFloat16));
  if (float32_out) run_amx<false>(x, codes, scales, mins, q4, out.data_ptr<float>());
  else run_amx<false>(x, codes, scales, mins, q4, out.data_ptr<at::BFloat16>());
  return out;
}

at::Tensor amx_linear_silu_mul(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                               const at::Tensor& mins, const std::string& format) {
  const bool q4 = check_amx_inputs(x, codes, scales, mins, format);
  auto out = at::empty({x.size(0), codes.size(0) * kTileN / 2}, x.options());
  run_amx<true>(x, codes, scales, mins, q4, out.data_ptr<at::BFloat16>());
  return out;
}
