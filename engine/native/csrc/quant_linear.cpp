// Linear layers over GGUF block-quantized weights, the codes exactly as the file stores them and
// de-quantized in registers, so a decode step reads 4.5-8.5 bits per weight instead of 16.
//
//   Q4_1: w[n, k] = d[n, k/32] * q[n, k] + m[n, k/32]   q in 0..15, two per byte
//   Q8_0: w[n, k] = d[n, k/32] * q[n, k]                q in -128..127
//
// Layout ("panels" of 8 output rows, so one tile reads one sequential stream, in steps of 32
// bytes per row):
//   codes  Q4_1: uint8 [N/8, K/64, 8, 32], read as 16-bit words [N/8, K/64, 4, 32]: in step s
//          (groups 2s and 2s + 1), the panel's row pair (2h, 2h + 1) has 32 words; word w belongs
//          to row 2h + ((w >> 1) & 1) at position e = 2 (w >> 2) + (w & 1) (0..15), and holds in
//          its four nibbles, low to high, group 2s's elements e and e + 16, then group 2s + 1's.
//          Q8_0: int8 [N/8, K/32, 8, 32], a row's group per step.
//   scales, mins  float16 [N/8, K/32, 8]  (mins: Q4_1 only)
// x [M, K] float32 or bfloat16 (K a multiple of 32, of 64 for Q4_1); out [M, N], float32
// (logits) or x's dtype.
//
// Why Q4_1's words: VPERMW looks a word up by its low 5 bits, so with a table of bf16(0..15)
// written twice, nibble k of 32 words becomes 32 bfloat16 codes in one shift and one lookup (no
// masking, no widening of bytes), and the two rows of a pair fill one VDPBF16PS (even lanes one
// row, odd lanes the other) against x's element pairs each written twice. A batch-1 step is bound
// by these instructions more than by the bytes: a third fewer of them per weight than with a
// row's 32 bytes widened into words (0.88x the time per layer's linears with the codes in
// cache, 0.91x from memory).
//
// The products and sums are float32. bfloat16 inputs meet the codes as bfloat16 integers (exact:
// |q| <= 128 has at most 8 significant bits) in VDPBF16PS, a group's sums scaled by d in one FMA;
// Q4_1's "+ m" part is sum_g m_g * (x summed over group g). float32 inputs meet the weights
// de-quantized in float32 (d * q exact, + m rounded once). Each output of each row is one chain
// over the groups in order, reduced in a fixed order, so a row's result does not depend on the
// batch it is in.
#include "aten.h"

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
constexpr int64_t kPrefetchSteps = 16;  // bf16 inputs: how many steps ahead the codes are requested
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

// Every cache line of the panel's step kPrefetchSteps after `step` (its codes, and the scales and
// mins of its first group `group`), requested now: the hardware prefetcher starts over at each 4 KiB
inline void prefetch_ahead(const uint8_t* step, const Weights& w, int64_t group, int64_t groups_per_step) {
  const char* ahead = reinterpret_cast<const char*>(step) + kPrefetchSteps * kPanel * kStepBytes;
  for (int line = 0; line < kPanel * kStepBytes; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
  const int64_t at = (group + kPrefetchSteps * groups_per_step) * kPanel;
  _mm_prefetch(reinterpret_cast<const char*>(w.scales + at), _MM_HINT_T0);
  if (w.mins != nullptr) _mm_prefetch(reinterpret_cast<const char*>(w.mins + at), _MM_HINT_T0);
}

// Q8_0, float32 inputs: one row's group de-quantized into elements 0..15 and 16..31
inline void dequant_q8_f32(const uint8_t* step_codes, __m512 d, __m512& lo, __m512& hi) {
  const auto* q = reinterpret_cast<const __m128i*>(step_codes);
  lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q))));
  hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1))));
}

// Q8_0 panel p against R input rows (float32), out[r, p * 8 + j]
template <int R, typename Out>
inline void panel_q8_f32(const float* x, int64_t K, const Weights& w, int64_t p, Out* out, int64_t N) {
  __m512 acc[kPanel][R];
  for (int j = 0; j < kPanel; ++j)
    for (int r = 0; r < R; ++r) acc[j][r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < w.groups; ++g) {
    const uint8_t* codes = w.codes + (p * w.groups + g) * kPanel * kStepBytes;
    _mm_prefetch(reinterpret_cast<const char*>(codes + 4 * kPanel * kStepBytes), _MM_HINT_T0);
    const __m512 d8 = load8_halves(w.scales + (p * w.groups + g) * kPanel);
    for (int j = 0; j < kPanel; ++j) {
      __m512 lo, hi;
      dequant_q8_f32(codes + j * kStepBytes, lane(d8, j), lo, hi);
      for (int r = 0; r < R; ++r)
        acc[j][r] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + r * K + g * kGroup + 16),
                                    _mm512_fmadd_ps(lo, _mm512_loadu_ps(x + r * K + g * kGroup), acc[j][r]));
    }
  }
  for (int j = 0; j < kPanel; ++j)
    for (int r = 0; r < R; ++r) out[r * N + p * kPanel + j] = static_cast<Out>(_mm512_reduce_add_ps(acc[j][r]));
}

// Q4_1 panel p against R input rows (float32). Words 0..15 of a row pair widen to float32 lanes
// 0..15 (rows alternating every two lanes: lane l is row (l >> 1) & 1 at position 2 (l >> 2) +
// (l & 1)), words 16..31 likewise at positions 8..15; x's elements are spread to match.
template <int R, typename Out>
inline void panel_q4_f32(const float* x, int64_t K, const Weights& w, int64_t p, Out* out, int64_t N) {
  const int64_t steps = w.groups / 2;
  const __m512i spread_x = _mm512_set_epi32(7, 6, 7, 6, 5, 4, 5, 4, 3, 2, 3, 2, 1, 0, 1, 0);
  __m512 acc[kPanel / 2][R];  // per row pair: lanes of row 2h where (lane >> 1) is even, else 2h + 1
  for (int h = 0; h < kPanel / 2; ++h)
    for (int r = 0; r < R; ++r) acc[h][r] = _mm512_setzero_ps();
  for (int64_t t = 0; t < steps; ++t) {
    const auto* codes = reinterpret_cast<const uint16_t*>(w.codes + (p * steps + t) * kPanel * kStepBytes);
    _mm_prefetch(reinterpret_cast<const char*>(codes) + 4 * kPanel * kStepBytes, _MM_HINT_T0);
    for (int i = 0; i < 2; ++i) {
      const int64_t g = 2 * t + i, pg = p * w.groups + g;
      const __m512 d8 = load8_halves(w.scales + pg * kPanel), m8 = load8_halves(w.mins + pg * kPanel);
      for (int h = 0; h < kPanel / 2; ++h) {
        const __m512i row_of_lane = _mm512_set_epi32(2 * h + 1, 2 * h + 1, 2 * h, 2 * h, 2 * h + 1, 2 * h + 1, 2 * h,
                                                     2 * h, 2 * h + 1, 2 * h + 1, 2 * h, 2 * h, 2 * h + 1, 2 * h + 1,
                                                     2 * h, 2 * h);
        const __m512 d = _mm512_permutexvar_ps(row_of_lane, d8), m = _mm512_permutexvar_ps(row_of_lane, m8);
        const __m512i words = _mm512_loadu_si512(codes + h * 32);
        for (int half = 0; half < 2; ++half) {  // elements 0..15 (nibble 2i), 16..31 (nibble 2i + 1)
          const __m512i q = _mm512_and_si512(_mm512_srli_epi16(words, 4 * (2 * i + half)), _mm512_set1_epi16(0x0F));
          const __m512 w_lo = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(q))), m);
          const __m512 w_hi =
              _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(q, 1))), m);
          for (int r = 0; r < R; ++r) {
            const float* xs = x + r * K + g * kGroup + 16 * half;
            const __m512 x_lo = _mm512_permutexvar_ps(spread_x, _mm512_castps256_ps512(_mm256_loadu_ps(xs)));
            const __m512 x_hi = _mm512_permutexvar_ps(spread_x, _mm512_castps256_ps512(_mm256_loadu_ps(xs + 8)));
            acc[h][r] = _mm512_fmadd_ps(w_hi, x_hi, _mm512_fmadd_ps(w_lo, x_lo, acc[h][r]));
          }
        }
      }
    }
  }
  for (int h = 0; h < kPanel / 2; ++h)
    for (int r = 0; r < R; ++r) {
      out[r * N + p * kPanel + 2 * h] = static_cast<Out>(_mm512_reduce_add_ps(_mm512_maskz_mov_ps(0x3333, acc[h][r])));
      out[r * N + p * kPanel + 2 * h + 1] =
          static_cast<Out>(_mm512_reduce_add_ps(_mm512_maskz_mov_ps(0xCCCC, acc[h][r])));
    }
}
#endif

#if defined(__AVX512BF16__)
// Q8_0 panel p against R input rows (bfloat16): a row's group as 32 bfloat16 integers
template <int R, typename Out>
inline void panel_q8_bf16(const at::BFloat16* x, int64_t K, const Weights& w, int64_t p, Out* out, int64_t N) {
  __m512 acc[kPanel][R];
  for (int j = 0; j < kPanel; ++j)
    for (int r = 0; r < R; ++r) acc[j][r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < w.groups; ++g) {
    const int64_t pg = p * w.groups + g;
    const __m512 d8 = load8_halves(w.scales + pg * kPanel);
    __m512i xg[R];
    for (int r = 0; r < R; ++r) xg[r] = _mm512_loadu_si512(x + r * K + g * kGroup);
    const uint8_t* codes = w.codes + pg * kPanel * kStepBytes;
    prefetch_ahead(codes, w, pg, 1);
    for (int j = 0; j < kPanel; ++j) {
      const auto* q8 = reinterpret_cast<const __m128i*>(codes + j * kStepBytes);
      const __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q8)));
      const __m512 b = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q8 + 1)));
      const __m512bh q = _mm512_cvtne2ps_pbh(b, a);  // elements 0..15 from a, 16..31 from b
      const __m512 dj = lane(d8, j);
      for (int r = 0; r < R; ++r) {
        const __m512 dot = _mm512_dpbf16_ps(_mm512_setzero_ps(), q, reinterpret_cast<__m512bh>(xg[r]));
        acc[j][r] = _mm512_fmadd_ps(dot, dj, acc[j][r]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < kPanel; ++j)
      out[r * N + p * kPanel + j] = static_cast<Out>(_mm512_reduce_add_ps(acc[j][r]));
}

// Q4_1 panel p against R input rows (bfloat16); group_sums [R, K/32] (the "+ m" part). Per step
// and row pair: 4 lookups make the pair's 128 codes bfloat16, 4 VDPBF16PS take them against x
// (a group's two halves into one sum), 2 FMAs scale each group's sums by its d (lanes of row 2h
// even, of 2h + 1 odd: one 64-bit broadcast of the pair's two scales).
template <int R, typename Out>
inline void panel_q4_bf16(const at::BFloat16* x, const float* group_sums, int64_t K, const Weights& w, int64_t p,
                          Out* out, int64_t N) {
  alignas(64) static const uint16_t kTable[32] = {  // bfloat16 of 0..15, twice
      0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0, 0x4100, 0x4110, 0x4120,
      0x4130, 0x4140, 0x4150, 0x4160, 0x4170, 0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0,
      0x40C0, 0x40E0, 0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150, 0x4160, 0x4170};
  const __m512i table = _mm512_load_si512(kTable);
  const __m512i spread_x = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);  // element pairs twice
  const int64_t steps = w.groups / 2;
  __m512 acc[kPanel / 2][R];  // per row pair: even lanes row 2h, odd lanes 2h + 1
  __m256 offset[R];           // sum_g m_g * group_sum_g for the panel's 8 outputs
  for (int r = 0; r < R; ++r) {
    offset[r] = _mm256_setzero_ps();
    for (int h = 0; h < kPanel / 2; ++h) acc[h][r] = _mm512_setzero_ps();
  }
  for (int64_t t = 0; t < steps; ++t) {
    alignas(32) float d[2][kPanel];  // the two groups' scales, read back by row pair as 64-bit broadcasts
    __m512i xs[R][4];                // [group 2t: elements 0..15, 16..31; group 2t + 1: the same]
    for (int i = 0; i < 2; ++i) {
      const int64_t g = 2 * t + i, pg = p * w.groups + g;
      _mm256_store_ps(d[i], _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.scales + pg * kPanel))));
      const __m256 m8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.mins + pg * kPanel)));
      for (int r = 0; r < R; ++r) {
        offset[r] = _mm256_fmadd_ps(m8, _mm256_set1_ps(group_sums[r * w.groups + g]), offset[r]);
        const at::BFloat16* xg = x + r * K + g * kGroup;
        for (int half = 0; half < 2; ++half)
          xs[r][2 * i + half] = _mm512_permutexvar_epi32(
              spread_x, _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg + 16 * half))));
      }
    }
    const uint8_t* step = w.codes + (p * steps + t) * kPanel * kStepBytes;
    const auto* codes = reinterpret_cast<const uint16_t*>(step);
    prefetch_ahead(step, w, p * w.groups + 2 * t, 2);
    for (int h = 0; h < kPanel / 2; ++h) {
      const __m512i words = _mm512_loadu_si512(codes + h * 32);
      __m512bh q[4];
      q[0] = reinterpret_cast<__m512bh>(_mm512_permutexvar_epi16(words, table));
      for (int k = 1; k < 4; ++k)
        q[k] = reinterpret_cast<__m512bh>(_mm512_permutexvar_epi16(_mm512_srli_epi16(words, 4 * k), table));
      const __m512 d0 = _mm512_castpd_ps(_mm512_set1_pd(*reinterpret_cast<const double*>(d[0] + 2 * h)));
      const __m512 d1 = _mm512_castpd_ps(_mm512_set1_pd(*reinterpret_cast<const double*>(d[1] + 2 * h)));
      for (int r = 0; r < R; ++r) {
        const __m512 dot0 = _mm512_dpbf16_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), q[0],
                                                              reinterpret_cast<__m512bh>(xs[r][0])),
                                             q[1], reinterpret_cast<__m512bh>(xs[r][1]));
        const __m512 dot1 = _mm512_dpbf16_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), q[2],
                                                              reinterpret_cast<__m512bh>(xs[r][2])),
                                             q[3], reinterpret_cast<__m512bh>(xs[r][3]));
        acc[h][r] = _mm512_fmadd_ps(dot1, d1, _mm512_fmadd_ps(dot0, d0, acc[h][r]));
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float offsets[kPanel];
    _mm256_store_ps(offsets, offset[r]);
    for (int h = 0; h < kPanel / 2; ++h) {
      out[r * N + p * kPanel + 2 * h] =
          static_cast<Out>(_mm512_reduce_add_ps(_mm512_maskz_mov_ps(0x5555, acc[h][r])) + offsets[2 * h]);
      out[r * N + p * kPanel + 2 * h + 1] =
          static_cast<Out>(_mm512_reduce_add_ps(_mm512_maskz_mov_ps(0xAAAA, acc[h][r])) + offsets[2 * h + 1]);
    }
  }
}
#endif

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(__AVX512F__)
// AVX2 + FMA, float32 inputs. A group's products q * x are summed in float32 and scaled by its d
// once (d * sum q x, + m * sum x for Q4_1, sum x per group computed once per call), rather than
// each weight de-quantized first: Q4_1 then costs three instructions per 8 weights (a mask, a
// conversion, an FMA), Q8_0 two and a load.
//
// Q4_1: 8 of a row pair's words widen to 8 int32 lanes (lane l: row (l >> 1) & 1, position
// 4 o + 2 (l >> 2) + (l & 1) for the words' octet o); nibble k is then taken in place, as 16^k q
// (a mask, no shift), against x's matching elements times 16^-k (exact: powers of two), spread to
// the lanes' positions once per call for every panel (`SpreadInputs`).
constexpr int kOctets = 4;  // octets of 8 words per row pair and step

// per input row: [K / 64 steps][4 nibbles][4 octets][8 lanes], the x each lane of an octet meets
inline int64_t spread_floats(int64_t K) { return K / 64 * 4 * kOctets * 8; }

inline void spread_inputs(const float* x, int64_t K, float* xs) {
  const __m256i lanes[2] = {_mm256_setr_epi32(0, 1, 0, 1, 2, 3, 2, 3), _mm256_setr_epi32(4, 5, 4, 5, 6, 7, 6, 7)};
  for (int64_t t = 0; t < K / 64; ++t)
    for (int k = 0; k < 4; ++k) {
      // nibble k: group 2t + k / 2, elements 16 (k % 2) ..; octet o: positions 4 o .. 4 o + 3
      const float* xg = x + (2 * t + k / 2) * kGroup + 16 * (k % 2);
      const __m256 unit = _mm256_set1_ps(1.f / static_cast<float>(1 << (4 * k)));
      for (int o = 0; o < kOctets; ++o) {
        const __m256 eight = _mm256_loadu_ps(xg + 8 * (o / 2));
        _mm256_storeu_ps(xs + ((t * 4 + k) * kOctets + o) * 8,
                         _mm256_mul_ps(_mm256_permutevar8x32_ps(eight, lanes[o % 2]), unit));
      }
    }
}

inline float sum_lanes(__m256 v, int mask) {  // the lanes in mask's bits
  alignas(32) float l[8];
  _mm256_store_ps(l, v);
  float s = 0.f;
  for (int i = 0; i < 8; ++i)
    if (mask >> i & 1) s += l[i];
  return s;
}

// Q4_1 panel p against R input rows: xs their spread inputs, group_sums [R, K/32] (the "+ m" part)
template <int R, typename Out>
inline void panel_q4_avx2(const float* xs, const float* group_sums, int64_t K, const Weights& w, int64_t p, Out* out,
                          int64_t N) {
  const int64_t steps = w.groups / 2, row_floats = spread_floats(K);
  const __m256i masks[4] = {_mm256_set1_epi32(0x000F), _mm256_set1_epi32(0x00F0), _mm256_set1_epi32(0x0F00),
                            _mm256_set1_epi32(0xF000)};
  __m256 total[R][kPanel / 2];  // per row pair: lanes (l >> 1) & 1 == 0 row 2h, else 2h + 1
  __m256 offset[R];            // sum_g m_g * group_sum_g for the panel's 8 outputs
  for (int r = 0; r < R; ++r) {
    offset[r] = _mm256_setzero_ps();
    for (int h = 0; h < kPanel / 2; ++h) total[r][h] = _mm256_setzero_ps();
  }
  for (int64_t t = 0; t < steps; ++t) {
    const uint8_t* step = w.codes + (p * steps + t) * kPanel * kStepBytes;
    _mm_prefetch(reinterpret_cast<const char*>(step) + kPrefetchSteps * kPanel * kStepBytes, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(step) + kPrefetchSteps * kPanel * kStepBytes + 64, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(step) + kPrefetchSteps * kPanel * kStepBytes + 128, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(step) + kPrefetchSteps * kPanel * kStepBytes + 192, _MM_HINT_T0);
    __m256 d[2];  // the two groups' scales of the panel's 8 rows
    for (int i = 0; i < 2; ++i) {
      const int64_t g = 2 * t + i, pg = (p * w.groups + g) * kPanel;
      d[i] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.scales + pg)));
      const __m256 m8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.mins + pg)));
      for (int r = 0; r < R; ++r)
        offset[r] = _mm256_fmadd_ps(m8, _mm256_set1_ps(group_sums[r * w.groups + g]), offset[r]);
    }
    for (int h = 0; h < kPanel / 2; ++h) {
      const __m256i row_of_lane = _mm256_setr_epi32(2 * h, 2 * h, 2 * h + 1, 2 * h + 1, 2 * h, 2 * h, 2 * h + 1, 2 * h + 1);
      const __m256 d0 = _mm256_permutevar8x32_ps(d[0], row_of_lane), d1 = _mm256_permutevar8x32_ps(d[1], row_of_lane);
      __m256i v[kOctets];
      for (int o = 0; o < kOctets; ++o)
        v[o] = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(step + h * 64 + 16 * o)));
      for (int r = 0; r < R; ++r) {
        const float* x = xs + r * row_floats + t * 4 * kOctets * 8;
        __m256 acc[4];  // per nibble: group 2t (0, 1), 2t + 1 (2, 3)
        for (int k = 0; k < 4; ++k) {
          acc[k] = _mm256_setzero_ps();
          for (int o = 0; o < kOctets; ++o)
            acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v[o], masks[k])),
                                     _mm256_loadu_ps(x + (k * kOctets + o) * 8), acc[k]);
        }
        total[r][h] = _mm256_fmadd_ps(_mm256_add_ps(acc[0], acc[1]), d0, total[r][h]);
        total[r][h] = _mm256_fmadd_ps(_mm256_add_ps(acc[2], acc[3]), d1, total[r][h]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float offsets[kPanel];
    _mm256_store_ps(offsets, offset[r]);
    for (int h = 0; h < kPanel / 2; ++h) {
      out[r * N + p * kPanel + 2 * h] = static_cast<Out>(sum_lanes(total[r][h], 0x33) + offsets[2 * h]);
      out[r * N + p * kPanel + 2 * h + 1] = static_cast<Out>(sum_lanes(total[r][h], 0xCC) + offsets[2 * h + 1]);
    }
  }
}

// Q8_0 panel p against R input rows (float32): a row's group as 4 x 8 int8 widened to float32
template <int R, typename Out>
inline void panel_q8_avx2(const float* x, int64_t K, const Weights& w, int64_t p, Out* out, int64_t N) {
  __m256 total[R][kPanel];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < kPanel; ++j) total[r][j] = _mm256_setzero_ps();
  for (int64_t g = 0; g < w.groups; ++g) {
    const int64_t pg = p * w.groups + g;
    const uint8_t* codes = w.codes + pg * kPanel * kStepBytes;
    for (int line = 0; line < kPanel * kStepBytes; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(codes) + kPrefetchSteps * kPanel * kStepBytes + line, _MM_HINT_T0);
    alignas(32) float d[kPanel];
    _mm256_store_ps(d, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.scales + pg * kPanel))));
    for (int j = 0; j < kPanel; ++j) {
      __m256 q[4];
      for (int o = 0; o < 4; ++o)
        q[o] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + j * kStepBytes + 8 * o))));
      for (int r = 0; r < R; ++r) {
        const float* xg = x + r * K + g * kGroup;
        __m256 acc = _mm256_mul_ps(q[0], _mm256_loadu_ps(xg));
        for (int o = 1; o < 4; ++o) acc = _mm256_fmadd_ps(q[o], _mm256_loadu_ps(xg + 8 * o), acc);
        total[r][j] = _mm256_fmadd_ps(acc, _mm256_set1_ps(d[j]), total[r][j]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < kPanel; ++j) out[r * N + p * kPanel + j] = static_cast<Out>(llm_serve::reduce_add8(total[r][j]));
}
#endif

// The same arithmetic without vectors (the scalar tier) (the order of the sums differs from the vector paths).
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
        const uint8_t* step = w.codes + (p * steps + g / G) * kPanel * kStepBytes;
        for (int i = 0; i < kGroup; ++i) {
          float wi;
          if constexpr (F == Format::kQ4_1) {
            // the word of row j at position i % 16, nibble (g % 2) * 2 + i / 16
            const int e = i % 16, word = (j / 2) * 32 + (e / 2) * 4 + static_cast<int>(j % 2) * 2 + e % 2;
            const int shift = 4 * (static_cast<int>(g % 2) * 2 + i / 16);
            const auto* words = reinterpret_cast<const uint16_t*>(step);
            wi = d * static_cast<float>((words[word] >> shift) & 0x0F) + static_cast<float>(w.mins[s]);
          } else {
            wi = d * static_cast<float>(static_cast<int8_t>(step[j * kStepBytes + i]));
          }
          acc += wi * xg[i];
        }
      }
      out[r * N + p * kPanel + j] = static_cast<Out>(acc);
    }
}

// One panel against input rows r0 .. r0 + R - 1
template <Format F, int R, typename In, typename Out>
inline void panel(const In* x, const float* group_sums, int64_t K, const Weights& w, int64_t p, Out* out, int64_t N) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<In, float>) {
    if constexpr (F == Format::kQ4_1) panel_q4_f32<R>(x, K, w, p, out, N);
    else panel_q8_f32<R>(x, K, w, p, out, N);
  }
#if defined(__AVX512BF16__)
  else if constexpr (F == Format::kQ4_1) {
    panel_q4_bf16<R>(x, group_sums, K, w, p, out, N);
  } else {
    panel_q8_bf16<R>(x, K, w, p, out, N);
  }
#endif
#endif
}

// Each thread takes a range of panels; within a panel the input rows go two at a time (the
// panel's codes stay in L1 between them).
template <Format F, typename In, typename Out>
void run(const In* x, const float* group_sums, int64_t M, int64_t K, const Weights& w, int64_t N, Out* out) {
  llm_serve::parallel_for(0, N / kPanel, 4, [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) {
#if defined(__AVX512F__)
      const auto sums = [&](int64_t r) { return group_sums == nullptr ? nullptr : group_sums + r * w.groups; };
      int64_t r = 0;
      for (; r + 2 <= M; r += 2) panel<F, 2>(x + r * K, sums(r), K, w, p, out + r * N, N);
      if (r < M) panel<F, 1>(x + r * K, sums(r), K, w, p, out + r * N, N);
#else
      panel_scalar<F>(x, M, K, w, p, out, N);
#endif
    }
  });
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(__AVX512F__)
// AVX2: each row's sum per group (Q4_1's "+ m" part) and its spread inputs, once for every panel,
// then each thread a range of panels, the input rows two at a time
template <Format F, typename Out>
void run_avx2(const float* x, int64_t M, int64_t K, const Weights& w, int64_t N, Out* out) {
  std::vector<float> group_sums, spread;
  if constexpr (F == Format::kQ4_1) {
    group_sums.resize(M * w.groups);
    for (int64_t i = 0; i < M * w.groups; ++i)
      group_sums[i] = llm_serve::reduce_add(llm_serve::add(llm_serve::load16(x + i * kGroup), llm_serve::load16(x + i * kGroup + 16)));
    spread.resize(M * spread_floats(K));
    for (int64_t r = 0; r < M; ++r) spread_inputs(x + r * K, K, spread.data() + r * spread_floats(K));
  }
  const auto rows = [&](auto R, int64_t r, int64_t p) {
    if constexpr (F == Format::kQ4_1)
      panel_q4_avx2<decltype(R)::value>(spread.data() + r * spread_floats(K), group_sums.data() + r * w.groups, K, w,
                                        p, out + r * N, N);
    else
      panel_q8_avx2<decltype(R)::value>(x + r * K, K, w, p, out + r * N, N);
  };
  llm_serve::parallel_for(0, N / kPanel, 4, [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) {
      int64_t r = 0;
      for (; r + 2 <= M; r += 2) rows(std::integral_constant<int, 2>{}, r, p);
      if (r < M) rows(std::integral_constant<int, 1>{}, r, p);
    }
  });
}
#endif

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
    run<F>(xp, group_sums.empty() ? nullptr : group_sums.data(), M, K, w, N, out);
    return;
  }
#endif
  const at::Tensor xf = x.to(at::kFloat).contiguous();
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(__AVX512F__)
  run_avx2<F>(xf.data_ptr<float>(), M, K, w, N, out);
#else
  run<F>(xf.data_ptr<float>(), nullptr, M, K, w, N, out);
#endif
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
