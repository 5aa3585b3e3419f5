// SiLU-and-multiply of the MLP on the CPU, one pass per row: what `F.silu(gate) * up` does in
// three torch calls (split, silu, mul), with its rounding points kept:
//
//     out = dtype(float(dtype(silu(float(gate)))) * float(up))     silu(x) = x / (1 + exp(-x))
//
// Shapes: x [rows, 2 * width] = [gate | up], contiguous; out [rows, width] in x's dtype.
#include "aten.h"

#include "parallel.h"
#include "vec16.h"

#include <cmath>

namespace {

#if defined(LLM_SERVE_VEC16)
using llm_serve::load16;
using llm_serve::store16;
#endif

template <typename T>
void silu_mul_rows(const T* x, T* out, int64_t rows, int64_t width) {
  llm_serve::parallel_for(0, rows, std::max<int64_t>(1, 8192 / width), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* gate = x + r * 2 * width;
      const T* up = gate + width;
      T* o = out + r * width;
      int64_t d = 0;
#if defined(LLM_SERVE_VEC16)
      for (; d + 16 <= width; d += 16) {
        store16(o + d, llm_serve::silu_mul16<T>(load16(gate + d), load16(up + d)));
      }
#endif
      for (; d < width; ++d) {
        const float g = static_cast<float>(gate[d]);
        const T s = static_cast<T>(g / (1.f + std::exp(-g)));
        o[d] = static_cast<T>(static_cast<float>(s) * static_cast<float>(up[d]));
      }
    }
  });
}

}  // namespace

at::Tensor silu_and_mul(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(1) % 2 == 0, "x: [rows, 2 * width], contiguous");
  const int64_t rows = x.size(0), width = x.size(1) / 2;
  at::Tensor out = at::empty({rows, width}, x.options());
  if (x.scalar_type() == at::kBFloat16)
    silu_mul_rows<at::BFloat16>(x.data_ptr<at::BFloat16>(), out.data_ptr<at::BFloat16>(), rows, width);
  else if (x.scalar_type() == at::kFloat)
    silu_mul_rows<float>(x.data_ptr<float>(), out.data_ptr<float>(), rows, width);
  else
    TORCH_CHECK(false, "silu_and_mul: float32 or bfloat16");
  return out;
}
