// The Python module of the native CPU kernels (engine/native/__init__.py builds and loads it).
#include <torch/extension.h>

#include <string>
#include <tuple>

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale);
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
                                                      const at::Tensor& weight, double eps);
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                        const std::string& format, bool float32_out);

std::tuple<at::Tensor, at::Tensor> rope_write_kv(const at::Tensor& qk, const at::Tensor& v, const at::Tensor& cos,
                                                 const at::Tensor& sin, at::Tensor k_cache, at::Tensor v_cache,
                                                 const at::Tensor& slot_mapping, int64_t heads);

at::Tensor silu_and_mul(const at::Tensor& x);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention,
        "paged decode attention: q [seqs, heads, head_dim], caches [kv_heads, blocks, block_size, head_dim]");
  m.def("fused_add_rms_norm", &fused_add_rms_norm, "(norm(x + residual), x + residual) over rows",
        py::arg("x"), py::arg("residual"), py::arg("weight"), py::arg("eps"));
  m.def("quant_linear", &quant_linear,
        "x [rows, in] @ W^T for GGUF group-32 codes (q4_1: uint8 [out, in/2] + float16 scales and mins; "
        "q8_0: int8 [out, in] + float16 scales)",
        py::arg("x"), py::arg("codes"), py::arg("scales"), py::arg("mins"), py::arg("format"),
        py::arg("float32_out") = false);
  m.def("rope_write_kv", &rope_write_kv,
        "RoPE on q and k ([tokens, heads + kv_heads, head_dim]) and this step's K/V written to the caches: "
        "(q, k) rotated",
        py::arg("qk"), py::arg("v"), py::arg("cos"), py::arg("sin"), py::arg("k_cache"), py::arg("v_cache"),
        py::arg("slot_mapping"), py::arg("heads"));
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up of x = [gate | up] ([rows, 2 * width])", py::arg("x"));
}
