// Activations as int8 per row and group of 32 inputs, x[m, k] ~ dx[m, g] * qx[m, k] with
// dx = amax / 127: what the VPDPBUSD kernels (int8_linear.cpp, q4_int8_linear.cpp) multiply.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "vec16.h"

#include <cstdint>
#include <vector>

namespace llm_serve {

constexpr int64_t kActivationGroup = 32;

struct Activations {
  std::vector<int8_t> q;         // [M, K]
  std::vector<float> scale;      // [M, G] dx
  std::vector<int32_t> offset;   // [M, G] -128 * sum of the group's q
};

#if defined(__AVX512VNNI__)
template <typename In>
void quantize_rows(const In* x, int64_t M, int64_t K, Activations& a) {
  const int64_t G = K / kActivationGroup;
  a.q.resize(M * K);
  a.scale.resize(M * G);
  a.offset.resize(M * G);
  at::parallel_for(0, M * G, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const In* xg = x + i * kActivationGroup;
      const __m512 v0 = load16(xg), v1 = load16(xg + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      const float inv = amax > 0.f ? 127.f / amax : 0.f;
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(inv)));  // nearest, ties to even
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(inv)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(a.q.data() + i * kActivationGroup), _mm512_cvtsepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(a.q.data() + i * kActivationGroup + 16), _mm512_cvtsepi32_epi8(q1));
      a.scale[i] = amax / 127.f;
      a.offset[i] = -128 * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    }
  });
}
#endif

}  // namespace llm_serve
