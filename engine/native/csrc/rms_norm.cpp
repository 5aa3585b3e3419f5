// Fused residual add + RMSNorm on the CPU, one pass per row: the same arithmetic as the torch
// path (engine/models/layers.py RMSNorm) with its rounding points kept:
//
//     sum = dtype(x + residual)                       (also returned: the next residual)
//     out = dtype(weight * dtype(float(sum) * rsqrt(mean(float(sum)^2) + eps)))
//
// Shapes: x, residual [rows, hidden] contiguous (residual may be absent: then sum = x);
// weight [hidden]. Each row is reduced on its own in a fixed order, so a row's result does not
// depend on the other rows.
#include "aten.h"

#include "parallel.h"
#include "vec16.h"

#include <cmath>
#include <tuple>

namespace {

#if defined(LLM_SERVE_VEC16)
using namespace llm_serve;  // NOLINT: the vector functions (vec16.h)

template <typename T>
void rms_norm_row_vec(const T* xr, const T* rr, const T* weight, T* o, T* sr, int64_t hidden, float eps) {
  f32x16 squares = zero16();
  for (int64_t d = 0; d < hidden; d += 16) {
    f32x16 s = load16(xr + d);
    if (rr != nullptr) {
      s = round_to<T>(add(s, load16(rr + d)));
      store16(sr + d, s);
    }
    squares = fmadd(s, s, squares);
  }
  const f32x16 scale =
      set16(1.f / std::sqrt(reduce_add(squares) / static_cast<float>(hidden) + eps));
  const T* sum = rr != nullptr ? sr : xr;
  for (int64_t d = 0; d < hidden; d += 16) {
    const f32x16 normed = round_to<T>(mul(load16(sum + d), scale));
    store16(o + d, mul(load16(weight + d), normed));
  }
}
#endif

template <typename T>
void rms_norm_rows(const T* x, const T* residual, const T* weight, T* out, T* sum_out, int64_t rows,
                   int64_t hidden, float eps) {
  llm_serve::parallel_for(0, rows, std::max<int64_t>(1, 4096 / hidden), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
#if defined(LLM_SERVE_VEC16)
      if (hidden % 16 == 0) {
        rms_norm_row_vec(x + r * hidden, residual == nullptr ? nullptr : residual + r * hidden, weight,
                            out + r * hidden, sum_out + r * hidden, hidden, eps);
        continue;
      }
#endif
      const T* xr = x + r * hidden;
      T* sr = sum_out + r * hidden;
      float squares = 0.f;
      if (residual != nullptr) {
        const T* rr = residual + r * hidden;
#pragma omp simd reduction(+ : squares)
        for (int64_t d = 0; d < hidden; ++d) {
          const T s = static_cast<T>(static_cast<float>(xr[d]) + static_cast<float>(rr[d]));
          sr[d] = s;
          const float f = static_cast<float>(s);
          squares += f * f;
        }
      } else {
#pragma omp simd reduction(+ : squares)
        for (int64_t d = 0; d < hidden; ++d) {
          const float f = static_cast<float>(xr[d]);
          squares += f * f;
        }
        sr = const_cast<T*>(xr);
      }
      const float scale = 1.f / std::sqrt(squares / static_cast<float>(hidden) + eps);
      T* o = out + r * hidden;
#pragma omp simd
      for (int64_t d = 0; d < hidden; ++d) {
        const T normed = static_cast<T>(static_cast<float>(sr[d]) * scale);
        o[d] = static_cast<T>(static_cast<float>(weight[d]) * static_cast<float>(normed));
      }
    }
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
                                                      const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x: [rows, hidden], contiguous");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && weight.scalar_type() == x.scalar_type(),
              "weight: [hidden] in x's dtype");
  const bool has_residual = residual.has_value() && residual->defined();
  if (has_residual)
    TORCH_CHECK(residual->sizes() == x.sizes() && residual->is_contiguous() && residual->scalar_type() == x.scalar_type(),
                "residual: like x");
  auto w = weight.contiguous();
  auto out = at::empty_like(x);
  auto sum = has_residual ? at::empty_like(x) : x;
  const int64_t rows = x.size(0), hidden = x.size(1);
  if (x.scalar_type() == at::kBFloat16) {
    rms_norm_rows<at::BFloat16>(x.data_ptr<at::BFloat16>(), has_residual ? residual->data_ptr<at::BFloat16>() : nullptr,
                                w.data_ptr<at::BFloat16>(), out.data_ptr<at::BFloat16>(), sum.data_ptr<at::BFloat16>(),
                                rows, hidden, static_cast<float>(eps));
  } else if (x.scalar_type() == at::kFloat) {
    rms_norm_rows<float>(x.data_ptr<float>(), has_residual ? residual->data_ptr<float>() : nullptr, w.data_ptr<float>(),
                         out.data_ptr<float>(), sum.data_ptr<float>(), rows, hidden, static_cast<float>(eps));
  } else {
    TORCH_CHECK(false, "fused_add_rms_norm: float32 or bfloat16");
  }
  return {out, sum};
}
