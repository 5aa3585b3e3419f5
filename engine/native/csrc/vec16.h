// 16 float32 lanes of AVX-512 over float32 or bfloat16 memory (loads, stores, bfloat16 rounding),
// shared by the kernels.
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
template <>
inline __m512 round_to<at::BFloat16>(__m512 v) { return _mm512_castsi512_ps(bf16_bits(v)); }

inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline void store16(at::BFloat16* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_bits(v), 16)));
}

}  // namespace llm_serve
#endif
