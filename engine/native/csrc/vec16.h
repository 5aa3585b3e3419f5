// 16 float32 lanes over float32 or bfloat16 memory (loads, stores, bfloat16 rounding, exp,
// reductions), shared by the kernels: one vector type, `f32x16`, with an implementation per ISA
// tier, so a kernel written on it is one algorithm for every tier that has vectors.
//
//   AVX-512 (avx512_* tiers): f32x16 is __m512 itself, so kernels may mix in AVX-512 intrinsics
//                             (the bf16, VNNI and AMX micro-kernels do).
//   AVX2 + FMA (avx2 tier):   f32x16 is two __m256 halves, lanes 0..7 and 8..15.
//   neither (scalar tier):    no f32x16; every kernel has a plain loop, the tiers' test oracle.
//
// LLM_SERVE_VEC16 is defined where f32x16 exists. Each function does the same float32 operations
// on every implementation (the same FMAs, the same exp polynomial, the same bfloat16 rounding), so a
// kernel's lanes round alike on both; only horizontal sums may add in another order.
#pragma once

#include "aten.h"
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <cstdint>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#define LLM_SERVE_VEC16 1
#endif

namespace llm_serve {

#if defined(__AVX512F__)
using f32x16 = __m512;

inline f32x16 zero16() { return _mm512_setzero_ps(); }
inline f32x16 set16(float x) { return _mm512_set1_ps(x); }
inline f32x16 load16(const float* p) { return _mm512_loadu_ps(p); }
inline f32x16 load16(const at::BFloat16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
// 16 int8 values as float32
inline f32x16 load16(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline f32x16 add(f32x16 a, f32x16 b) { return _mm512_add_ps(a, b); }
inline f32x16 sub(f32x16 a, f32x16 b) { return _mm512_sub_ps(a, b); }
inline f32x16 mul(f32x16 a, f32x16 b) { return _mm512_mul_ps(a, b); }
inline f32x16 div(f32x16 a, f32x16 b) { return _mm512_div_ps(a, b); }
inline f32x16 max(f32x16 a, f32x16 b) { return _mm512_max_ps(a, b); }
inline f32x16 min(f32x16 a, f32x16 b) { return _mm512_min_ps(a, b); }
inline f32x16 fmadd(f32x16 a, f32x16 b, f32x16 c) { return _mm512_fmadd_ps(a, b, c); }
inline f32x16 fnmadd(f32x16 a, f32x16 b, f32x16 c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a * b, fused
inline float reduce_add(f32x16 v) { return _mm512_reduce_add_ps(v); }
inline float reduce_max(f32x16 v) { return _mm512_reduce_max_ps(v); }
// lanes 0..n-1 of v, `fill` in the others (0 <= n <= 16)
inline f32x16 first_lanes(f32x16 v, int n, float fill = 0.f) {
  return _mm512_mask_blend_ps(static_cast<__mmask16>((1u << n) - 1), _mm512_set1_ps(fill), v);
}
// v's lanes where v > x, 0 elsewhere
inline f32x16 where_greater(f32x16 v, float x) {
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, _mm512_set1_ps(x), _CMP_GT_OQ), v);
}
inline bool any_nan(f32x16 v) { return _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0; }
// the first lane equal to x, or -1
inline int first_equal(f32x16 v, float x) {
  const __mmask16 hit = _mm512_cmp_ps_mask(v, _mm512_set1_ps(x), _CMP_EQ_OQ);
  return hit ? __builtin_ctz(hit) : -1;
}

// float32 lanes rounded to bfloat16 as c10::BFloat16 does (nearest, ties to even; NaN kept), as
// the 32-bit patterns of the rounded values
inline __m512i bf16_bits(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_blend_epi32(nan, _mm512_and_si512(rounded, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))),
                                 _mm512_set1_epi32(0x7FC00000));
}

// v rounded to T and back to float32 lanes
template <typename T>
inline f32x16 round_to(f32x16 v);
template <>
inline f32x16 round_to<float>(f32x16 v) { return v; }
#if defined(__AVX512BF16__)
// VCVTNEPS2BF16 rounds as c10::BFloat16 does (nearest, ties to even) in one instruction; it differs
// only for denormal inputs (taken as zero; no activation comes within 1e-38 of zero) and in a
// NaN's payload (still a NaN)
template <>
inline f32x16 round_to<at::BFloat16>(f32x16 v) {
  const __m256i rounded = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(rounded), 16));
}
#else
template <>
inline f32x16 round_to<at::BFloat16>(f32x16 v) { return _mm512_castsi512_ps(bf16_bits(v)); }
#endif

inline void store16(float* p, f32x16 v) { _mm512_storeu_ps(p, v); }
inline void store16(at::BFloat16* p, f32x16 v) {
#if defined(__AVX512BF16__)
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
#else
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_bits(v), 16)));
#endif
}

// r[j] = op over the 16 lanes of v[j], j = 0..15 (pairs, then quads within 128-bit lanes, then
// across them); op is a lane-wise max or add, exact in any order
template <typename Op>
inline f32x16 reduce_lanes16(const f32x16* v, Op op) {
  __m512 a[8], b[4];
  for (int i = 0; i < 8; ++i) a[i] = op(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)
    b[i] = op(_mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44), _mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0xEE));
  const __m512 c0 = op(_mm512_shuffle_f32x4(b[0], b[1], 0x88), _mm512_shuffle_f32x4(b[0], b[1], 0xDD));
  const __m512 c1 = op(_mm512_shuffle_f32x4(b[2], b[3], 0x88), _mm512_shuffle_f32x4(b[2], b[3], 0xDD));
  return op(_mm512_shuffle_f32x4(c0, c1, 0x88), _mm512_shuffle_f32x4(c0, c1, 0xDD));
}

// x * 2^n for integral n in float32 lanes, one rounding (as VSCALEFPS)
inline f32x16 scale_by_pow2(f32x16 x, f32x16 n) { return _mm512_scalef_ps(x, n); }
inline f32x16 round_nearest(f32x16 x) {
  return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

#elif defined(LLM_SERVE_VEC16)  // AVX2 + FMA + F16C
struct f32x16 {
  __m256 lo, hi;  // lanes 0..7, 8..15
};

inline f32x16 zero16() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline f32x16 set16(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline f32x16 load16(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline __m256 bf16x8_to_f32(__m128i raw) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16)); }
inline f32x16 load16(const at::BFloat16* p) {
  const auto* q = reinterpret_cast<const __m128i*>(p);
  return {bf16x8_to_f32(_mm_loadu_si128(q)), bf16x8_to_f32(_mm_loadu_si128(q + 1))};
}
inline f32x16 load16(const int8_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(raw, 8)))};
}
inline f32x16 add(f32x16 a, f32x16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline f32x16 sub(f32x16 a, f32x16 b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline f32x16 mul(f32x16 a, f32x16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline f32x16 div(f32x16 a, f32x16 b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline f32x16 max(f32x16 a, f32x16 b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline f32x16 min(f32x16 a, f32x16 b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
inline f32x16 fmadd(f32x16 a, f32x16 b, f32x16 c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline f32x16 fnmadd(f32x16 a, f32x16 b, f32x16 c) {
  return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
inline float reduce_add8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
inline float reduce_add(f32x16 v) { return reduce_add8(_mm256_add_ps(v.lo, v.hi)); }
inline float reduce_max(f32x16 v) {
  const __m256 m8 = _mm256_max_ps(v.lo, v.hi);
  const __m128 s = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
  const __m128 t = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(t, _mm_movehdup_ps(t)));
}
// all ones in lanes 0..n-1 of each half's mask (n may be outside 0..16)
inline void lane_masks(int n, __m256& lo, __m256& hi) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  lo = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), index));
  hi = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n - 8), index));
}
inline f32x16 first_lanes(f32x16 v, int n, float fill = 0.f) {
  __m256 mlo, mhi;
  lane_masks(n, mlo, mhi);
  const __m256 f = _mm256_set1_ps(fill);
  return {_mm256_blendv_ps(f, v.lo, mlo), _mm256_blendv_ps(f, v.hi, mhi)};
}
inline f32x16 where_greater(f32x16 v, float x) {
  const __m256 xv = _mm256_set1_ps(x);
  return {_mm256_and_ps(v.lo, _mm256_cmp_ps(v.lo, xv, _CMP_GT_OQ)), _mm256_and_ps(v.hi, _mm256_cmp_ps(v.hi, xv, _CMP_GT_OQ))};
}
inline bool any_nan(f32x16 v) {
  return _mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(v.lo, v.lo, _CMP_UNORD_Q), _mm256_cmp_ps(v.hi, v.hi, _CMP_UNORD_Q))) != 0;
}
inline int first_equal(f32x16 v, float x) {
  const __m256 xv = _mm256_set1_ps(x);
  const int hit = _mm256_movemask_ps(_mm256_cmp_ps(v.lo, xv, _CMP_EQ_OQ)) |
                  (_mm256_movemask_ps(_mm256_cmp_ps(v.hi, xv, _CMP_EQ_OQ)) << 8);
  return hit ? __builtin_ctz(hit) : -1;
}

// as the AVX-512 bf16_bits, on 8 lanes
inline __m256i bf16_bits8(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_and_si256(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))),
                                           _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)));
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(rounded),
                                              _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), nan));
}

template <typename T>
inline f32x16 round_to(f32x16 v);
template <>
inline f32x16 round_to<float>(f32x16 v) { return v; }
template <>
inline f32x16 round_to<at::BFloat16>(f32x16 v) {
  return {_mm256_castsi256_ps(bf16_bits8(v.lo)), _mm256_castsi256_ps(bf16_bits8(v.hi))};
}

inline void store16(float* p, f32x16 v) {
  _mm256_storeu_ps(p, v.lo);
  _mm256_storeu_ps(p + 8, v.hi);
}
inline void store16(at::BFloat16* p, f32x16 v) {
  // the rounded top halves, packed within 128-bit lanes (lo 0-3, hi 0-3, lo 4-7, hi 4-7), then in order
  const __m256i words = _mm256_packus_epi32(_mm256_srli_epi32(bf16_bits8(v.lo), 16), _mm256_srli_epi32(bf16_bits8(v.hi), 16));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_permute4x64_epi64(words, 0xD8));
}

// r[j] = op over the 16 lanes of v[j], j = 0..15: each vector's halves, then the 8-lane
// transposing reduction of AVX-512's, for each half of r
template <typename Op>
inline __m256 reduce_lanes8(const __m256* t, Op op) {
  __m256 a[4], b[2];
  for (int i = 0; i < 4; ++i) a[i] = op(_mm256_unpacklo_ps(t[2 * i], t[2 * i + 1]), _mm256_unpackhi_ps(t[2 * i], t[2 * i + 1]));
  for (int i = 0; i < 2; ++i)
    b[i] = op(_mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44), _mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0xEE));
  return op(_mm256_permute2f128_ps(b[0], b[1], 0x20), _mm256_permute2f128_ps(b[0], b[1], 0x31));
}
template <typename Op>
inline f32x16 reduce_lanes16(const f32x16* v, Op op) {
  const auto op8 = [&](__m256 a, __m256 b) { return op(f32x16{a, a}, f32x16{b, b}).lo; };
  __m256 t[16];
  for (int j = 0; j < 16; ++j) t[j] = op8(v[j].lo, v[j].hi);
  return {reduce_lanes8(t, op8), reduce_lanes8(t + 8, op8)};
}

inline f32x16 round_nearest(f32x16 x) {
  constexpr int kMode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(x.lo, kMode), _mm256_round_ps(x.hi, kMode)};
}
// x * 2^n for integral n (|n| <= 254) with one rounding, as VSCALEFPS: two exact steps of 2^(n/2),
// each a normal power of two, the second alone able to round (into a denormal) or overflow
inline __m256 scale_by_pow2_8(__m256 x, __m256 n) {
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const auto pow2 = [](__m256i e) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23)); };
  return _mm256_mul_ps(_mm256_mul_ps(x, pow2(half)), pow2(_mm256_sub_epi32(ni, half)));
}
inline f32x16 scale_by_pow2(f32x16 x, f32x16 n) { return {scale_by_pow2_8(x.lo, n.lo), scale_by_pow2_8(x.hi, n.hi)}; }
#endif

#if defined(LLM_SERVE_VEC16)
// exp over 16 float32 lanes (Cephes' expf: 2^n * e^r, |r| <= ln2 / 2, degree-5 polynomial;
// within 2 ulp of the true value; the clamp keeps r in range, and 2^n still takes |x| > 88.7 to
// infinity or 0 as expf does)
inline f32x16 exp16(f32x16 x) {
  x = max(min(x, set16(104.f)), set16(-104.f));
  const f32x16 n = round_nearest(mul(x, set16(1.44269504088896341f)));
  f32x16 r = fnmadd(n, set16(0.693359375f), x);
  r = fnmadd(n, set16(-2.12194440e-4f), r);
  f32x16 p = set16(1.9875691500e-4f);
  p = fmadd(p, r, set16(1.3981999507e-3f));
  p = fmadd(p, r, set16(8.3334519073e-3f));
  p = fmadd(p, r, set16(4.1665795894e-2f));
  p = fmadd(p, r, set16(1.6666665459e-1f));
  p = fmadd(p, r, set16(5.0000001201e-1f));
  const f32x16 e = add(fmadd(mul(p, r), r, r), set16(1.f));
  return scale_by_pow2(e, n);
}

// silu(gate) * up for 16 lanes with the torch path's rounding points (silu_mul.cpp):
// T(float(T(silu(gate))) * up), silu(g) = g / (1 + exp(-g)); gate, up already values of T
template <typename T>
inline f32x16 silu_mul16(f32x16 gate, f32x16 up) {
  const f32x16 s = round_to<T>(div(gate, add(set16(1.f), exp16(sub(zero16(), gate)))));
  return mul(s, up);
}
#endif

}  // namespace llm_serve
