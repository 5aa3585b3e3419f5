// 16 float32 lanes of AVX-512 over float32 or bfloat16 memory (loads, stores, bfloat16 rounding,
// exp), shared by the kernels.
#pragma once

#include <ATen/ATen.h>
#include <immintrin.h>

#if defined(__AVX512F__)
namespace llm_serve {

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const at::BFloat16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
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
inline __m512 round_to(__m512 v);
template <>
inline __m512 round_to<float>(__m512 v) { return v; }
#if defined(__AVX512BF16__)
// VCVTNEPS2BF16 rounds as c10::BFloat16 does (nearest, ties to even) in one instruction; it differs
// only for denormal inputs (taken as zero; no activation comes within 1e-38 of zero) and in a
// NaN's payload (still a NaN)
template <>
inline __m512 round_to<at::BFloat16>(__m512 v) {
  const __m256i rounded = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(rounded), 16));
}
#else
template <>
inline __m512 round_to<at::BFloat16>(__m512 v) { return _mm512_castsi512_ps(bf16_bits(v)); }
#endif

inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline void store16(at::BFloat16* p, __m512 v) {
#if defined(__AVX512BF16__)
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
#else
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_bits(v), 16)));
#endif
}

// r[j] = op over the 16 lanes of v[j], j = 0..15 (pairs, then quads within 128-bit lanes, then
// across them); op is a lane-wise max or add, exact in any order
template <typename Op>
inline __m512 reduce_lanes16(const __m512* v, Op op) {
  __m512 a[8], b[4];
  for (int i = 0; i < 8; ++i) a[i] = op(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)
    b[i] = op(_mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44), _mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0xEE));
  const __m512 c0 = op(_mm512_shuffle_f32x4(b[0], b[1], 0x88), _mm512_shuffle_f32x4(b[0], b[1], 0xDD));
  const __m512 c1 = op(_mm512_shuffle_f32x4(b[2], b[3], 0x88), _mm512_shuffle_f32x4(b[2], b[3], 0xDD));
  return op(_mm512_shuffle_f32x4(c0, c1, 0x88), _mm512_shuffle_f32x4(c0, c1, 0xDD));
}

// exp over 16 float32 lanes (Cephes' expf: 2^n * e^r, |r| <= ln2 / 2, degree-5 polynomial;
// within 2 ulp of the true value; the clamp keeps r in range, and 2^n still takes |x| > 88.7 to
// infinity or 0 as expf does)
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(104.f)), _mm512_set1_ps(-104.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 e = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(e, n);
}

// silu(gate) * up for 16 lanes with the torch path's rounding points (silu_mul.cpp):
// T(float(T(silu(gate))) * up), silu(g) = g / (1 + exp(-g)); gate, up already values of T
template <typename T>
inline __m512 silu_mul16(__m512 gate, __m512 up) {
  const __m512 s = round_to<T>(_mm512_div_ps(gate, _mm512_add_ps(_mm512_set1_ps(1.f),
                                                                exp16(_mm512_sub_ps(_mm512_setzero_ps(), gate)))));
  return _mm512_mul_ps(s, up);
}

}  // namespace llm_serve
#endif
