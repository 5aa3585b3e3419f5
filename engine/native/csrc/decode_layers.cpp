// A decode step's decoder layers (Llama family: add + RMSNorm, q/k/v, RoPE + KV write, paged
// decode attention, o, add + RMSNorm, gate/up, silu-and-mul, down) in one native call: the same
// kernels in the same order as the Python modules call them, so the result is bitwise theirs,
// without the Python between them (at one row, a step's ~300 module and kernel calls cost as much
// as reading the weights).
#include "decode_layers.h"

#include "kernels.h"
#include "lora_delta.h"

#include <utility>

DecodeLayers::DecodeLayers(std::vector<at::Tensor> norm_weights, const std::vector<at::Tensor>& codes,
                           const std::vector<at::Tensor>& scales, const std::vector<at::Tensor>& mins,
                           const std::vector<std::string>& formats, const std::vector<at::Tensor>& int8_codes,
                           const std::vector<at::Tensor>& int8_scales, const std::vector<at::Tensor>& int8_mins,
                           const std::vector<std::string>& batch_kinds,
                           const std::vector<at::Tensor>& batch_codes, const std::vector<at::Tensor>& batch_scales,
                           const std::vector<at::Tensor>& batch_mins, const std::vector<int64_t>& codes_rows,
                           std::vector<at::Tensor> k_caches,
                           std::vector<at::Tensor> v_caches, int64_t heads, int64_t kv_heads, int64_t head_dim,
                           double eps, double scale)
    : norm_weights_(std::move(norm_weights)),
      k_caches_(std::move(k_caches)),
      v_caches_(std::move(v_caches)),
      heads_(heads),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      eps_(eps),
      scale_(scale) {
  const size_t layers = k_caches_.size();
  TORCH_CHECK(v_caches_.size() == layers && norm_weights_.size() == 2 * layers, "two norms and two caches per layer");
  TORCH_CHECK(codes.size() == 4 * layers && scales.size() == codes.size() && mins.size() == codes.size() &&
                  formats.size() == codes.size(),
              "four linears per layer");
  TORCH_CHECK(int8_codes.size() == codes.size() && int8_scales.size() == codes.size() &&
                  int8_mins.size() == codes.size() && batch_kinds.size() == codes.size() &&
                  batch_codes.size() == codes.size() && batch_scales.size() == codes.size() &&
                  batch_mins.size() == codes.size() && codes_rows.size() == codes.size(),
              "int8 codes, batch methods and codes_rows for every linear");
  for (size_t i = 0; i < codes.size(); ++i) {
    TORCH_CHECK(batch_kinds[i].empty() || batch_kinds[i] == "int8" || batch_kinds[i] == "amx" ||
                    batch_kinds[i] == "q4int8",
                "batch kind \"\", int8, amx or q4int8");
    linears_.push_back({codes[i], scales[i], mins[i], formats[i], int8_codes[i], int8_scales[i], int8_mins[i],
                        batch_kinds[i], batch_codes[i], batch_scales[i], batch_mins[i], codes_rows[i]});
  }
}

namespace {
// as GroupQuantizedMethod.apply and apply_codes choose (the one call takes no batch-invariant
// rows, and more rows than codes_rows only where every linear has a native batch method)
at::Tensor apply(const CodesLinear& w, const at::Tensor& x) {
  if (x.size(0) > w.codes_rows) {
    TORCH_CHECK(!w.batch_kind.empty(), "more rows than the codes' crossover and no native batch method");
    if (w.batch_kind == "amx") return amx_linear(x, w.batch_codes, w.batch_scales, w.batch_mins, w.format, false);
    if (w.batch_kind == "q4int8") return q4_int8_linear(x, w.batch_codes, w.batch_scales, w.batch_mins, false);
    return int8_linear(x, w.batch_codes, w.batch_scales, false);
  }
  if (w.int8_codes.numel() > 0) return q4_int8_linear(x, w.int8_codes, w.int8_scales, w.int8_mins, false);
  return quant_linear(x, w.codes, w.scales, w.mins, w.format, false);
}

// silu_and_mul(apply(w, x)), in one pass where the rows take a native batch method
at::Tensor gate_up_silu_mul(const CodesLinear& w, const at::Tensor& x) {
  if (x.size(0) > w.codes_rows && w.batch_kind == "amx")
    return amx_linear_silu_mul(x, w.batch_codes, w.batch_scales, w.batch_mins, w.format);
  if (x.size(0) > w.codes_rows && w.batch_kind == "int8" && w.batch_codes.size(0) % 2 == 0)
    return int8_linear_silu_mul(x, w.batch_codes, w.batch_scales);
  return silu_and_mul(apply(w, x));
}
}  // namespace

void DecodeLayers::set_lora(std::vector<at::Tensor> a, std::vector<at::Tensor> bt,
                            std::vector<std::vector<int64_t>> slices) {
  TORCH_CHECK(a.size() == linears_.size() && bt.size() == linears_.size() && slices.size() == linears_.size(),
              "LoRA slots for every linear");
  lora_a_ = std::move(a);
  lora_bt_ = std::move(bt);
  lora_slices_ = std::move(slices);
  lora_num_slots_ = 0;
  for (const at::Tensor& t : lora_a_)
    if (t.numel() > 0) lora_num_slots_ = t.size(0);
}

std::tuple<at::Tensor, at::Tensor> DecodeLayers::forward(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin,
                                                         const at::Tensor& slot_mapping,
                                                         const at::Tensor& block_tables,
                                                         const at::Tensor& seq_lens,
                                                         const c10::optional<at::Tensor>& lora_slots) const {
  const int64_t rows = x.size(0), q_size = heads_ * head_dim_, kv_size = kv_heads_ * head_dim_;
  TORCH_CHECK(!lora_slots.has_value() || !lora_a_.empty(), "LoRA rows and no LoRA slots set");
  // the step's rows grouped by adapter slot once, for every projection's delta
  const LoraRows step_rows = lora_slots.has_value() ? lora_rows(*lora_slots, lora_num_slots_) : LoraRows();
  auto has_lora = [&](size_t i) { return lora_slots.has_value() && lora_a_[i].numel() > 0; };
  // the linear's output with the rows' adapter deltas added, as Linear.forward adds them
  auto linear = [&](size_t i, const at::Tensor& input) {
    at::Tensor out = apply(linears_[i], input);
    if (has_lora(i)) lora_add_delta_rows(input, out, lora_a_[i], lora_bt_[i], step_rows, lora_slices_[i]);
    return out;
  };
  at::Tensor residual;
  for (size_t layer = 0; layer < k_caches_.size(); ++layer) {
    const size_t i = 4 * layer;
    at::Tensor h;  // the first layer has no residual yet: the norm's "sum" is then x itself
    std::tie(h, residual) = fused_add_rms_norm(x, layer == 0 ? c10::optional<at::Tensor>() : residual,
                                               norm_weights_[2 * layer], eps_);
    const at::Tensor qkv = linear(i, h);
    const at::Tensor qk = qkv.slice(1, 0, q_size + kv_size).view({rows, heads_ + kv_heads_, head_dim_});
    const at::Tensor v = qkv.slice(1, q_size + kv_size).view({rows, kv_heads_, head_dim_});
    const auto q_k = rope_write_kv(qk, v, cos, sin, k_caches_[layer], v_caches_[layer], slot_mapping, heads_);
    const at::Tensor o = paged_decode_attention(std::get<0>(q_k).contiguous(), k_caches_[layer], v_caches_[layer],
                                                block_tables, seq_lens, scale_);
    x = linear(i + 1, o.reshape({rows, q_size}));
    std::tie(h, residual) = fused_add_rms_norm(x, residual, norm_weights_[2 * layer + 1], eps_);
    // with an adapter on gate/up its delta goes in before silu-and-mul: no fused pass then
    x = linear(i + 3, has_lora(i + 2) ? silu_and_mul(linear(i + 2, h)) : gate_up_silu_mul(linears_[i + 2], h));
  }
  return {x, residual};
}
