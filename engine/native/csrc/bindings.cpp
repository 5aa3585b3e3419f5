// The Python module of the native CPU kernels, one per ISA tier (setup.py builds them,
// engine/native/__init__.py loads the one the CPU runs).
// pybind11 with ATen's type casters, not <torch/extension.h> (all of libtorch's C++ API: 28 s of CPU
// to compile, 8 here), once per ISA tier
#include <torch/csrc/utils/pybind.h>
#include <pybind11/stl.h>

#include "decode_layers.h"
#include "kernels.h"

#ifndef LLM_SERVE_TIER
#define LLM_SERVE_TIER "unnamed"
#endif
#if __has_include("sources_hash.h")
#include "sources_hash.h"  // written by setup.py
#else
#define LLM_SERVE_SOURCES_HASH ""
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("tier") = LLM_SERVE_TIER;
  m.attr("sources_hash") = LLM_SERVE_SOURCES_HASH;
  m.def("paged_decode_attention", &paged_decode_attention,
        "paged decode attention: q [seqs, heads, head_dim], caches [kv_heads, blocks, block_size, head_dim]");
  m.def("prefill_attention_available", &prefill_attention_available,
        "whether paged_prefill_attention was built (AVX512-BF16)");
  m.def("paged_prefill_attention", &paged_prefill_attention,
        "causal attention of prompt chunks' rows (q [rows, heads, head_dim] bf16) over their keys in the paged "
        "cache: block_tables [chunks, blocks], query_starts [chunks + 1], context_lens [chunks], int32",
        py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("block_tables"), py::arg("query_starts"),
        py::arg("context_lens"), py::arg("scale"));
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
  py::class_<DecodeLayers>(m, "DecodeLayers", py::module_local(),
                          "a decode step's decoder layers in one call (decode_layers.h)")
      .def(py::init<std::vector<at::Tensor>, const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
                    const std::vector<at::Tensor>&, const std::vector<std::string>&, const std::vector<at::Tensor>&,
                    const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
                    const std::vector<std::string>&, const std::vector<at::Tensor>&,
                    const std::vector<at::Tensor>&, const std::vector<at::Tensor>&, const std::vector<int64_t>&,
                    std::vector<at::Tensor>, std::vector<at::Tensor>, int64_t, int64_t, int64_t, double, double>(),
           py::arg("norm_weights"), py::arg("codes"), py::arg("scales"), py::arg("mins"), py::arg("formats"),
           py::arg("int8_codes"), py::arg("int8_scales"), py::arg("int8_mins"),
           py::arg("batch_kinds"), py::arg("batch_codes"), py::arg("batch_scales"), py::arg("batch_mins"),
           py::arg("codes_rows"),
           py::arg("k_caches"), py::arg("v_caches"), py::arg("heads"), py::arg("kv_heads"), py::arg("head_dim"),
           py::arg("eps"), py::arg("scale"))
      .def("set_lora", &DecodeLayers::set_lora,
           "each linear's LoRA slots (a [slots, width, in], bt [slots, width, out]; empty where none) and "
           "expand slices (lora_add_delta's)",
           py::arg("a"), py::arg("bt"), py::arg("slices"))
      .def("forward", &DecodeLayers::forward, py::arg("x"), py::arg("cos"), py::arg("sin"), py::arg("slot_mapping"),
           py::arg("block_tables"), py::arg("seq_lens"), py::arg("lora_slots") = py::none());
  m.def("lora_add_delta", &lora_add_delta,
        "out[i] += (x[i] a[s]^T) bt[s] for each row i of slot s = slots[i] >= 0, in place (a LoRA delta); "
        "slices: (rank begin, rank end, column begin, column end) of bt's nonzero blocks, flat (none: all of it)",
        py::arg("x"), py::arg("out"), py::arg("a"), py::arg("bt"), py::arg("slots"),
        py::arg("slices") = std::vector<int64_t>());
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up of x = [gate | up] ([rows, 2 * width])", py::arg("x"));
  m.def("int8_linear_available", &int8_linear_available, "whether int8_linear was built (AVX512-VNNI or AVX2)");
  m.def("int8_linear", &int8_linear,
        "x [rows, in] @ W^T, x as int8 per group of 64 and W as int8 per output (uint8 [out/16, in/4, 16, 4], "
        "q + 128; float32 scales [out])",
        py::arg("x"), py::arg("weights"), py::arg("w_scale"), py::arg("float32_out") = false);
  m.def("int8_linear_silu_mul", &int8_linear_silu_mul,
        "silu_and_mul(int8_linear(x, ...)) in one pass, for weights of [gate | up] (two halves of equal width): "
        "the sums rounded as int8_linear rounds them, then silu(gate) * up as silu_and_mul computes it",
        py::arg("x"), py::arg("weights"), py::arg("w_scale"));
  m.def("q4_int8_linear_available", &q4_int8_linear_available, "whether q4_int8_linear was built (AVX512-VNNI or AVX2)");
  m.def("q4_int8_linear", &q4_int8_linear,
        "x [rows, in] @ W^T, W the Q4_1 codes (uint8 [out/16, in/32, 4, 64] + float16 scales and mins "
        "[out/16, in/32, 16]), x as int8 per group of 32",
        py::arg("x"), py::arg("codes"), py::arg("scales"), py::arg("mins"), py::arg("float32_out") = false);
  m.def("amx_linear_available", &amx_linear_available,
        "whether amx_linear was built and the CPU lets this process use AMX tiles");
  m.def("amx_linear", &amx_linear,
        "x [rows, in] bf16 @ W^T, W the GGUF codes in AMX tiles (q4_1: uint8 [out/16, in/32, 16, 16], q8_0: "
        "int8 [out/16, in/32, 16, 32]; float16 scales and mins [out/16, in/32, 16]) as bf16 weights",
        py::arg("x"), py::arg("codes"), py::arg("scales"), py::arg("mins"), py::arg("format"),
        py::arg("float32_out") = false);
  m.def("amx_linear_silu_mul", &amx_linear_silu_mul,
        "silu_and_mul(amx_linear(x, ...)) in one pass: the codes' outputs [gate | up] (two halves of equal "
        "width) rounded to bf16 as amx_linear rounds them, then silu(gate) * up as silu_and_mul computes it",
        py::arg("x"), py::arg("codes"), py::arg("scales"), py::arg("mins"), py::arg("format"));
  m.def("argmax_rows", &argmax_rows, "torch.argmax(logits, dim=-1) of float32 [rows, vocab], the rows in parallel",
        py::arg("logits"));
  m.def("inverse_cdf", &inverse_cdf, "per row, the token whose slice of the cumulative distribution holds u x total",
        py::arg("probs"), py::arg("u"));
  m.def("nucleus_ok", &nucleus_ok, "whether each drawn token survives top-p and min-p", py::arg("probs"),
        py::arg("token"), py::arg("top_p"), py::arg("min_p"), py::arg("top_prob"));
}
