// 16 float32 lanes of AVX-512 over float32 or bfloat16 memory, shared by the kernels.
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

}  // namespace llm_serve
#endif
