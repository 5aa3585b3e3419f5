// Linear layers over GGUF block-quantized weights, the codes exactly as the file stores them and
// de-quantized in registers, so a decode step reads 4.5-8.5 bits per weight instead of 16.
//
//   Q4_1: w[n, k] = d[n, k/32] * q[n, k] + m[n, k/32]   q in 0..15, two per byte
//   Q8_0: w[n, k] = d[n, k/32] * q[n, k]                q in -128..127
//
// Layout ("panels" of 8 output rows, so one tile reads one sequential stream, in steps of 32
// bytes per row):
//   codes  uint8 [N/8, K/64, 8, 32] (Q4_1: byte i of a step holds element i of group 2s in its
//          low nibble and element i of group 2s+1 in its high one, so one load and a mask or a
//          shift give a whole group) or int8 [N/8, K/32, 8, 32] (Q8_0: a group per step)
//   scales, mins  float16 [N/8, K/32, 8]  (mins: Q4_1 only)
// x [M, K] float32 or bfloat16 (K a multiple of 32, of 64 for Q4_1); out [M, N], float32
// (logits) or x's dtype.
//
// The products and sums are float32. bfloat16 inputs meet the codes as bfloat16 integers (exact:
// |q| <= 128 has at most 8 significant bits) in one VDPBF16PS per group, scaled by d in one FMA;
// Q4_1's "+ m" part is sum_g m_g * (x summed over group g). float32 inputs meet the weights
// de-quantized in float32 (d * q exact, + m rounded once). Each output of each row is one chain
// over the groups in order, reduced in a fixed order, so a row's result does not depend on the
// batch it is in.
#include <ATen/ATen.h>

#include "parallel.h"
#include "vec16.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kGroup = 32;
constexpr int64_t kPanel = 8;  // output rows per panel

enum class Format { kQ4_1, kQ8_0 };

constexpr int64_t kStepBytes = 32;  // per row per step, both formats
template <Format F>
constexpr int groups_per_step() { return F == Format::kQ4_1 ? 2 : 1; }

struct Weights {
  const uint8_t* codes;
  const at::Half* scales;
  const at::Half* mins;
  int64_t groups;  // K / 32
};

#if defined(__AVX512F__)
// 8 float16 values as float32 lanes 0..7 of a 512-bit vector (8..15 are zero)
inline __m512 load8_halves(const at::Half* p) {
  return _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline __m512 lane(__m512 v, int j) { return _mm512_permutexvar_ps(_mm512_set1_epi32(j), v); }

// float32 inputs: group i of one row's step de-quantized into elements 0..15 and 16..31
template <Format F>
inline void dequant_f32(const uint8_t* step_codes, int i, __m512 d, __m512 m, __m512& lo, __m512& hi) {
  const auto* q = reinterpret_cast<const __m128i*>(step_codes);
  if constexpr (F == Format::kQ4_1) {
    const __m512i a = _mm512_cvtepu8_epi32(_mm_loadu_si128(q)), b = _mm512_cvtepu8_epi32(_mm_loadu_si128(q + 1));
    const __m512i nibble = _mm512_set1_epi32(0x0F);
    const __m512i qa = i == 0 ? _mm512_and_si512(a, nibble) : _mm512_srli_epi32(a, 4);
    const __m512i qb = i == 0 ? _mm512_and_si512(b, nibble) : _mm512_srli_epi32(b, 4);
    lo = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(qa), m);
    hi = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(qb), m);
  } else {
    lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q))));
    hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1))));
  }
}

// Panel p against R input rows (float32), out[r, p * 8 + j]
template <Format F, int R, typename Out>
inline void panel_f32(const float* x, int64_t K, const Weights& w, int64_t p, Out* out, int64_t N) {
  constexpr int G = groups_per_step<F>();
  const int64_t steps = w.groups / G;
  __m512 acc[kPanel][R];
  for (int j = 0; j < kPanel; ++j)
    for (int r = 0; r < R; ++r) acc[j][r] = _mm512_setzero_ps();
  for (int64_t t = 0; t < steps; ++t) {
    const uint8_t* codes = w.codes + (p * steps + t) * kPanel * kStepBytes;
    _mm_prefetch(reinterpret_cast<const char*>(codes + 4 * kPanel * kStepBytes), _MM_HINT_T0);
    for (int i = 0; i < G; ++i) {
      const int64_t g = t * G + i, pg = p * w.groups + g;
      const __m512 d8 = load8_halves(w.scales + pg * kPanel);
      const __m512 m8 = F == Format::kQ4_1 ? load8_halves(w.mins + pg * kPanel) : _mm512_setzero_ps();
      for (int j = 0; j < kPanel; ++j) {
        __m512 lo, hi;
        dequant_f32<F>(codes + j * kStepBytes, i, lane(d8, j), lane(m8, j), lo, hi);
        for (int r = 0; r < R; ++r)
          acc[j][r] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + r * K + g * kGroup + 16),
                                      _mm512_fmadd_ps(lo, _mm512_loadu_ps(x + r * K + g * kGroup), acc[j][r]));
      }
    }
  }
  for (int j = 0; j < kPanel; ++j)
    for (int r = 0; r < R; ++r) out[r * N + p * kPanel + j] = static_cast<Out>(_mm512_reduce_add_ps(acc[j][r]));
}
#endif

#if defined(__AVX512BF16__)
// One row's step as bfloat16 integers, a vector of 32 per group: Q4_1 two groups (the low
// and the high nibbles, through a 16-entry table), Q8_0 one.
template <Format F>
inline void decode_bf16(const uint8_t* step_codes, __m512i table, __m512i* q) {
  if constexpr (F == Format::kQ4_1) {
    const __m512i words = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(step_codes)));
    q[0] = _mm512_permutexvar_epi16(_mm512_and_si512(words, _mm512_set1_epi16(0x0F)), table);
    q[1] = _mm512_permutexvar_epi16(_mm512_srli_epi16(words, 4), table);
  } else {
    const auto* p = reinterpret_cast<const __m128i*>(step_codes);
    const __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p)));
    const __m512 b = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p + 1)));
    q[0] = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));  // elements 0..15 from a, 16..31 from b
  }
}

// Panel p against R input rows (bfloat16); group_sums [R, K/32] (Q4_1's "+ m" part)
template <Format F, int R, typename Out>
inline void panel_bf16(const at::BFloat16* x, const float* group_sums, int64_t K, const Weights& w, int64_t p,
                       Out* out, int64_t N) {
  alignas(64) static const uint16_t kTable[32] = {0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0,
                                                  0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150, 0x4160, 0x4170};
  constexpr int G = groups_per_step<F>();
  const int64_t steps = w.groups / G;
  const __m512i table = _mm512_load_si512(kTable);  // bfloat16 of 0..15
  __m512 acc[kPanel][R];
  __m256 offset[R];  // Q4_1: sum_g m_g * group_sum_g for the panel's 8 outputs
  for (int r = 0; r < R; ++r) {
    offset[r] = _mm256_setzero_ps();
    for (int j = 0; j < kPanel; ++j) acc[j][r] = _mm512_setzero_ps();
  }
  for (int64_t t = 0; t < steps; ++t) {
    __m512 d8[G];
    __m512i xg[G][R];
    for (int i = 0; i < G; ++i) {
      const int64_t g = t * G + i, pg = p * w.groups + g;
      d8[i] = load8_halves(w.scales + pg * kPanel);
      if constexpr (F == Format::kQ4_1) {
        const __m256 m8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.mins + pg * kPanel)));
        for (int r = 0; r < R; ++r)
          offset[r] = _mm256_fmadd_ps(m8, _mm256_set1_ps(group_sums[r * w.groups + g]), offset[r]);
      }
      for (int r = 0; r < R; ++r) xg[i][r] = _mm512_loadu_si512(x + r * K + g * kGroup);
    }
    const uint8_t* codes = w.codes + (p * steps + t) * kPanel * kStepBytes;
    _mm_prefetch(reinterpret_cast<const char*>(codes + 4 * kPanel * kStepBytes), _MM_HINT_T0);
    for (int j = 0; j < kPanel; ++j) {
      __m512i q[G];
      decode_bf16<F>(codes + j * kStepBytes, table, q);
      for (int i = 0; i < G; ++i) {
        const __m512 dj = lane(d8[i], j);
        for (int r = 0; r < R; ++r) {
          const __m512 dot = _mm512_dpbf16_ps(_mm512_setzero_ps(), reinterpret_cast<__m512bh>(q[i]),
                                              reinterpret_cast<__m512bh>(xg[i][r]));
          acc[j][r] = _mm512_fmadd_ps(dot, dj, acc[j][r]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float offsets[kPanel];
    _mm256_store_ps(offsets, offset[r]);
    for (int j = 0; j < kPanel; ++j)
      out[r * N + p * kPanel + j] = static_cast<Out>(_mm512_reduce_add_ps(acc[j][r]) + offsets[j]);
  }
}
#endif

// The same arithmetic without AVX-512 (the order of the sums differs from the vector paths).
template <Format F, typename Out>
void panel_scalar(const float* x, int64_t M, int64_t K, const Weights& w, int64_t p, Out* out, int64_t N) {
  constexpr int G = groups_per_step<F>();
  const int64_t steps = w.groups / G;
  for (int64_t j = 0; j < kPanel; ++j)
    for (int64_t r = 0; r < M; ++r) {
      float acc = 0.f;
      for (int64_t g = 0; g < w.groups; ++g) {
        const int64_t s = (p * w.groups + g) * kPanel + j;
        const float d = static_cast<float>(w.scales[s]);
        const float* xg = x + r * K + g * kGroup;
        const uint8_t* q = w.codes + ((p * steps + g / G) * kPanel + j) * kStepBytes;
        for (int i = 0; i < kGroup; ++i) {
          float wi;
          if constexpr (F == Format::kQ4_1)
            wi = d * static_cast<float>(g % 2 == 0 ? (q[i] & 0x0F) : (q[i] >> 4)) + static_cast<float>(w.mins[s]);
          else
            wi = d * static_cast<float>(static_cast<int8_t>(q[i]));
          acc += wi * xg[i];
        }
      }
      out[r * N + p * kPanel + j] = static_cast<Out>(acc);
    }
}

// Each thread takes a range of panels; within a panel the input rows go two at a time (the
// panel's codes stay in L1 between them).
template <Format F, typename In, typename Out>
void run(const In* x, const float* group_sums, int64_t M, int64_t K, const Weights& w, int64_t N, Out* out) {
  llm_serve::parallel_for(0, N / kPanel, 4, [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) {
#if defined(__AVX512F__)
      int64_t r = 0;
      for (; r + 2 <= M; r += 2) {
        if constexpr (std::is_same_v<In, float>) panel_f32<F, 2>(x + r * K, K, w, p, out + r * N, N);
#if defined(__AVX512BF16__)
        else panel_bf16<F, 2>(x + r * K, group_sums + r * w.groups, K, w, p, out + r * N, N);
#endif
      }
      if (r < M) {
        if constexpr (std::is_same_v<In, float>) panel_f32<F, 1>(x + r * K, K, w, p, out + r * N, N);
#if defined(__AVX512BF16__)
        else panel_bf16<F, 1>(x + r * K, group_sums + r * w.groups, K, w, p, out + r * N, N);
#endif
      }
#else
      panel_scalar<F>(x, M, K, w, p, out, N);
#endif
    }
  });
}

template <Format F, typename Out>
void dispatch_input(const at::Tensor& x, int64_t M, int64_t K, const Weights& w, int64_t N, Out* out) {
#if defined(__AVX512BF16__)
  if (x.scalar_type() == at::kBFloat16) {
    const at::Tensor xb = x.contiguous();
    const at::BFloat16* xp = xb.data_ptr<at::BFloat16>();
    // each row's sum over each group, in float32 (Q4_1's "+ m" part): here, not as torch ops,
    // which would cost more than the sums at decode sizes
    std::vector<float> group_sums(F == Format::kQ4_1 ? M * w.groups : 0);
    for (int64_t i = 0; i < static_cast<int64_t>(group_sums.size()); ++i)
      group_sums[i] = _mm512_reduce_add_ps(_mm512_add_ps(llm_serve::load16(xp + i * kGroup),
                                                         llm_serve::load16(xp + i * kGroup + 16)));
    run<F>(xp, group_sums.data(), M, K, w, N, out);
    return;
  }
#endif
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  run<F>(xf.data_ptr<float>(), nullptr, M, K, w, N, out);
}

}  // namespace

// format: "q4_1" or "q8_0" (codes in the panel layout above); mins is ignored for q8_0.
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                        const std::string& format, bool float32_out) {
  TORCH_CHECK(x.dim() == 2, "x: [rows, in_features]");
  TORCH_CHECK(format == "q4_1" || format == "q8_0", "format: q4_1 or q8_0");
  const bool q4 = format == "q4_1";
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(K % (q4 ? 2 * kGroup : kGroup) == 0, "in_features must be a multiple of 32 (q8_0) or 64 (q4_1)");
  TORCH_CHECK(codes.is_contiguous() && codes.dim() == 4 && codes.size(1) == K / kGroup / (q4 ? 2 : 1) &&
                  codes.size(2) == kPanel && codes.size(3) == kStepBytes &&
                  codes.scalar_type() == (q4 ? at::kByte : at::kChar),
              "codes: uint8 [out/8, in/64, 8, 32] (q4_1) or int8 [out/8, in/32, 8, 32] (q8_0), contiguous");
  const int64_t N = codes.size(0) * kPanel;
  TORCH_CHECK(scales.is_contiguous() && scales.scalar_type() == at::kHalf && scales.numel() == N * (K / kGroup),
              "scales: float16 [out/8, in/32, 8], contiguous");
  if (q4)
    TORCH_CHECK(mins.is_contiguous() && mins.scalar_type() == at::kHalf && mins.numel() == N * (K / kGroup),
                "mins: float16 [out/8, in/32, 8], contiguous");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "x: float32 or bfloat16");
  const auto out_dtype = float32_out ? at::kFloat : x.scalar_type();
  at::Tensor out = at::empty({M, N}, x.options().dtype(out_dtype));
  const Weights w{reinterpret_cast<const uint8_t*>(codes.data_ptr()), scales.data_ptr<at::Half>(),
                  q4 ? mins.data_ptr<at::Half>() : nullptr, K / kGroup};
  if (out_dtype == at::kFloat) {
    if (q4) dispatch_input<Format::kQ4_1>(x, M, K, w, N, out.data_ptr<float>());
    else dispatch_input<Format::kQ8_0>(x, M, K, w, N, out.data_ptr<float>());
  } else {
    if (q4) dispatch_input<Format::kQ4_1>(x, M, K, w, N, out.data_ptr<at::BFloat16>());
    else dispatch_input<Format::kQ8_0>(x, M, K, w, N, out.data_ptr<at::BFloat16>());
  }
  return out;
}
