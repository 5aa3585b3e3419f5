// The Python module of the native CPU kernels (engine/native/__init__.py builds and loads it).
#include <torch/extension.h>

#include <tuple>

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale);
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
                                                      const at::Tensor& weight, double eps);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention,
        "paged decode attention: q [seqs, heads, head_dim], caches [kv_heads, blocks, block_size, head_dim]");
  m.def("fused_add_rms_norm", &fused_add_rms_norm, "(norm(x + residual), x + residual) over rows",
        py::arg("x"), py::arg("residual"), py::arg("weight"), py::arg("eps"));
}
