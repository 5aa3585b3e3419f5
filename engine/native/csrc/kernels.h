// The native CPU kernels' entry points, for the Python module (bindings.cpp) and for the kernels
// that call each other (decode_layers.cpp).
#pragma once

#include "aten.h"

#include <string>
#include <tuple>
#include <vector>

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale);
bool prefill_attention_available();
at::Tensor paged_prefill_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                   const at::Tensor& block_tables, const at::Tensor& query_starts,
                                   const at::Tensor& context_lens, double scale);
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
                                                      const at::Tensor& weight, double eps);
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                        const std::string& format, bool float32_out);
std::tuple<at::Tensor, at::Tensor> rope_write_kv(const at::Tensor& qk, const at::Tensor& v, const at::Tensor& cos,
                                                 const at::Tensor& sin, at::Tensor k_cache, at::Tensor v_cache,
                                                 const at::Tensor& slot_mapping, int64_t heads);
at::Tensor silu_and_mul(const at::Tensor& x);
at::Tensor argmax_rows(const at::Tensor& logits);
at::Tensor inverse_cdf(const at::Tensor& probs, const at::Tensor& u);
at::Tensor nucleus_ok(const at::Tensor& probs, const at::Tensor& token, const c10::optional<at::Tensor>& top_p,
                      const c10::optional<at::Tensor>& min_p, const c10::optional<at::Tensor>& top_prob);
bool int8_linear_available();
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& weights, const at::Tensor& w_scale, bool float32_out);
at::Tensor int8_linear_silu_mul(const at::Tensor& x, const at::Tensor& weights, const at::Tensor& w_scale);
bool q4_int8_linear_available();
at::Tensor q4_int8_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                          const at::Tensor& mins, bool float32_out);
bool amx_linear_available();
at::Tensor amx_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                      const std::string& format, bool float32_out);
at::Tensor amx_linear_silu_mul(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                               const at::Tensor& mins, const std::string& format);
// out[i] += (x[i] A[s]^T) B[s]^T for each row i of slot s = slots[i] >= 0, in place (lora_delta.cpp)
void lora_add_delta(const at::Tensor& x, at::Tensor out, const at::Tensor& a, const at::Tensor& bt,
                    const at::Tensor& slots, const std::vector<int64_t>& slices);
