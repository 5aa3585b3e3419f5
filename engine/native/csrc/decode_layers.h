// A decode step's decoder layers in one native call (see decode_layers.cpp).
#pragma once

#include "aten.h"

#include <string>
#include <tuple>
#include <vector>

// One linear layer on GGUF codes in quant_linear's panel layout, or (--batch-linear int8) the
// same Q4_1 codes in q4_int8_linear.cpp's layout against int8 activations; empty int8_codes where
// the layer has none.
struct CodesLinear {
  at::Tensor codes, scales, mins;
  std::string format;
  at::Tensor int8_codes, int8_scales, int8_mins;
  // for steps of more than codes_rows rows, the native batch method: "int8" (int8_linear.cpp:
  // batch_codes, batch_scales) or "amx" (amx_linear.cpp: the codes in tiles, their scales and
  // mins); "" where the layer's batch method is dense, whose steps NativeDecodeLayers never sends
  std::string batch_kind;
  at::Tensor batch_codes, batch_scales, batch_mins;
  int64_t codes_rows;
};

class DecodeLayers {
 public:
  // Per layer, in order: input norm weight, q/k/v, o, post-attention norm weight, gate/up, down;
  // the linears' codes, scales, mins and formats as four lists of 4 * layers, then their int8
  // codes (three lists, empty tensors where none), their native batch methods (kinds, codes,
  // scales, mins; "" and empty tensors where none) and codes_rows; the caches per layer.
  DecodeLayers(std::vector<at::Tensor> norm_weights, const std::vector<at::Tensor>& codes,
               const std::vector<at::Tensor>& scales, const std::vector<at::Tensor>& mins,
               const std::vector<std::string>& formats, const std::vector<at::Tensor>& int8_codes,
               const std::vector<at::Tensor>& int8_scales, const std::vector<at::Tensor>& int8_mins,
               const std::vector<std::string>& batch_kinds, const std::vector<at::Tensor>& batch_codes,
               const std::vector<at::Tensor>& batch_scales, const std::vector<at::Tensor>& batch_mins,
               const std::vector<int64_t>& codes_rows,
               std::vector<at::Tensor> k_caches,
               std::vector<at::Tensor> v_caches, int64_t heads, int64_t kv_heads, int64_t head_dim, double eps,
               double scale);

  // The LoRA adapter slots of every linear (4 * layers, in the order above; empty tensors where a
  // linear has none): A [slots, width, in], B transposed [slots, width, out] and the expand's
  // slices, as lora_add_delta takes them. The tensors are shared with the Python side, which loads
  // adapters into them.
  void set_lora(std::vector<at::Tensor> a, std::vector<at::Tensor> bt, std::vector<std::vector<int64_t>> slices);

  // x [rows, hidden] (the embeddings); cos, sin [rows, 1, head_dim]; this step's slot mapping
  // [rows] int64, block tables [rows, blocks] int32, sequence lengths [rows] int32; where rows run
  // LoRA adapters, each row's adapter slot [rows] int32 (-1: the base model). Returns the last
  // layer's (output, residual), before the final norm.
  std::tuple<at::Tensor, at::Tensor> forward(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin,
                                             const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                                             const at::Tensor& seq_lens,
                                             const c10::optional<at::Tensor>& lora_slots) const;

 private:
  std::vector<at::Tensor> norm_weights_;  // [2 * layers]
  std::vector<CodesLinear> linears_;      // [4 * layers]: qkv, o, gate_up, down
  std::vector<at::Tensor> lora_a_, lora_bt_;  // [4 * layers] once set_lora ran, empty tensors where none
  std::vector<std::vector<int64_t>> lora_slices_;
  int64_t lora_num_slots_ = 0;
  std::vector<at::Tensor> k_caches_, v_caches_;
  int64_t heads_, kv_heads_, head_dim_;
  double eps_, scale_;
};
