// Activations as int8 per row and group of 32 inputs, x[m, k] ~ dx[m, g] * qx[m, k] with
// dx = amax / 127: what the VPDPBUSD kernels (int8_linear.cpp, q4_int8_linear.cpp) multiply.
#pragma once

#include <ATen/ATen.h>

#include "parallel.h"
#include "vec16.h"

#include <cstdint>
#include <memory>

namespace llm_serve {

constexpr int64_t kActivationGroup = 32;

// A buffer that keeps its memory between calls and only grows, uninitialized: a std::vector
// resized for every call allocated and zero-filled what the quantization then overwrote (at 512
// rows of 1,536 inputs, 786 KB of memset per call: 4 % of a prefill step's time)
template <typename T>
class GrowBuffer {
 public:
  void resize(int64_t n) {
    if (n > capacity_) {
      data_.reset(new T[n]);
      capacity_ = n;
    }
  }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  T& operator[](int64_t i) { return data_[i]; }
  const T& operator[](int64_t i) const { return data_[i]; }

 private:
  std::unique_ptr<T[]> data_;
  int64_t capacity_ = 0;
};

// One per calling thread (thread_local in each kernel's run), reused by every call
struct Activations {
  GrowBuffer<int8_t> q;         // [M, K]
  GrowBuffer<float> scale;      // [M, G] dx
  GrowBuffer<int32_t> offset;   // [M, G] -128 * sum of the group's q
};

#if defined(__AVX512VNNI__)
template <typename In>
void quantize_rows(const In* x, int64_t M, int64_t K, Activations& a) {
  const int64_t G = K / kActivationGroup;
  a.q.resize(M * K);
  a.scale.resize(M * G);
  a.offset.resize(M * G);
  llm_serve::parallel_for(0, M * G, 64, [&](int64_t lo, int64_t hi) {
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

// The checks every int8 kernel makes of its input: x [rows, in_features], float32 or bfloat16,
// in_features a multiple of 32.
inline void check_int8_input(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "x: float32 or bfloat16 [rows, in_features]");
  TORCH_CHECK(x.size(1) % kActivationGroup == 0, "in_features must be a multiple of 32");
}

// out [rows, n] for x, float32 if float32_out (or x is float32), else x's dtype, filled by
// run(x's data, out's data) with the two element types
template <typename Run>
at::Tensor run_int8_kernel(const at::Tensor& x, int64_t n, bool float32_out, Run run) {
  const auto out_dtype = float32_out ? at::kFloat : x.scalar_type();
  at::Tensor out = at::empty({x.size(0), n}, x.options().dtype(out_dtype));
  const at::Tensor xc = x.contiguous();
  if (x.scalar_type() == at::kFloat) {
    run(xc.data_ptr<float>(), out.data_ptr<float>());  // float32 out either way
  } else if (float32_out) {
    run(xc.data_ptr<at::BFloat16>(), out.data_ptr<float>());
  } else {
    run(xc.data_ptr<at::BFloat16>(), out.data_ptr<at::BFloat16>());
  }
  return out;
}

}  // namespace llm_serve
