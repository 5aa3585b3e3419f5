// RoPE on q and k and the KV-cache write of one step, in one pass per token on the CPU: what the
// torch path does in about ten calls per layer (engine/models/layers.py apply_rope, then
// engine/attention/torch_paged.py write_kv), with its rounding points kept:
//
//     out = dtype(dtype(x * cos) + dtype(rotate_half(x) * sin))   cos = [c, c], sin = [-s, s]
//
// Shapes: qk [tokens, heads + kv_heads, head_dim] and v [tokens, kv_heads, head_dim], any row and
// head strides (views of the fused qkv projection), the last dimension contiguous; cos, sin
// [tokens, head_dim] contiguous, in qk's dtype; caches [kv_heads, blocks, block_size, head_dim]
// contiguous in qk's dtype, or int8 [kv_heads, blocks, block_size, head_dim + 4] (kv_int8.h: the
// rows quantized as they are written); slot_mapping [tokens] int64 (block * block_size + offset).
// Returns the rotated q [tokens, heads, head_dim] and k [tokens, kv_heads, head_dim] (contiguous;
// k is also what a cache in qk's dtype now holds).
#include "aten.h"

#include "kv_int8.h"
#include "parallel.h"
#include "vec16.h"

#include <cstring>
#include <tuple>

namespace {

template <typename T>
void rotate(const T* x, const T* cos, const T* sin, T* out, int64_t head_dim) {
  const int64_t half = head_dim / 2;
#if defined(LLM_SERVE_VEC16)
  if (half % 16 == 0) {  // 16 lanes at a time; the rotated half of lanes d.. starts at (d + half) % head_dim
    using namespace llm_serve;  // NOLINT: the vector functions (vec16.h)
    for (int64_t d = 0; d < head_dim; d += 16) {
      const f32x16 a = round_to<T>(mul(load16(x + d), load16(cos + d)));
      const f32x16 b = round_to<T>(mul(load16(x + (d + half) % head_dim), load16(sin + d)));
      llm_serve::store16(out + d, add(a, b));
    }
    return;
  }
#endif
  for (int64_t d = 0; d < head_dim; ++d) {
    const float swapped = static_cast<float>(d < half ? x[d + half] : x[d - half]);
    const T a = static_cast<T>(static_cast<float>(x[d]) * static_cast<float>(cos[d]));
    const T b = static_cast<T>(swapped * static_cast<float>(sin[d]));
    out[d] = static_cast<T>(static_cast<float>(a) + static_cast<float>(b));
  }
}

// one K or V row into a cache row of T (a copy) or of int8 (quantized)
template <typename T>
inline void store_row(const T* x, T* row, int64_t head_dim) { std::memcpy(row, x, head_dim * sizeof(T)); }
template <typename T>
inline void store_row(const T* x, int8_t* row, int64_t head_dim) { llm_serve::quantize_int8_row(x, row, head_dim); }

template <typename T, typename C>
void rope_write(const at::Tensor& qk, const at::Tensor& v, const at::Tensor& cos, const at::Tensor& sin,
                at::Tensor& k_cache, at::Tensor& v_cache, const int64_t* slots, int64_t heads, at::Tensor& q_out,
                at::Tensor& k_out) {
  const int64_t tokens = qk.size(0), kv_heads = qk.size(1) - heads, head_dim = qk.size(2);
  const int64_t num_slots = k_cache.size(1) * k_cache.size(2), row = k_cache.size(3);
  const T* qkp = qk.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  const T* cp = cos.data_ptr<T>();
  const T* sp = sin.data_ptr<T>();
  C* kc = k_cache.data_ptr<C>();
  C* vc = v_cache.data_ptr<C>();
  T* qo = q_out.data_ptr<T>();
  T* ko = k_out.data_ptr<T>();
  llm_serve::parallel_for(0, tokens, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t slot = slots[t];
      const T* c = cp + t * head_dim;
      const T* s = sp + t * head_dim;
      for (int64_t h = 0; h < heads; ++h)
        rotate(qkp + t * qk.stride(0) + h * qk.stride(1), c, s, qo + (t * heads + h) * head_dim, head_dim);
      for (int64_t h = 0; h < kv_heads; ++h) {
        T* k_row = ko + (t * kv_heads + h) * head_dim;
        rotate(qkp + t * qk.stride(0) + (heads + h) * qk.stride(1), c, s, k_row, head_dim);
        store_row(k_row, kc + (h * num_slots + slot) * row, head_dim);
        store_row(vp + t * v.stride(0) + h * v.stride(1), vc + (h * num_slots + slot) * row, head_dim);
      }
    }
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> rope_write_kv(const at::Tensor& qk, const at::Tensor& v, const at::Tensor& cos,
                                                 const at::Tensor& sin, at::Tensor k_cache, at::Tensor v_cache,
                                                 const at::Tensor& slot_mapping, int64_t heads) {
  TORCH_CHECK(qk.dim() == 3 && qk.stride(2) == 1 && qk.size(1) > heads, "qk: [tokens, heads + kv_heads, head_dim]");
  const int64_t tokens = qk.size(0), kv_heads = qk.size(1) - heads, head_dim = qk.size(2);
  TORCH_CHECK(head_dim % 2 == 0, "head_dim must be even");
  TORCH_CHECK(v.dim() == 3 && v.size(0) == tokens && v.size(1) == kv_heads && v.size(2) == head_dim && v.stride(2) == 1,
              "v: [tokens, kv_heads, head_dim]");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.numel() == tokens * head_dim &&
                  sin.numel() == tokens * head_dim,
              "cos, sin: [tokens, head_dim], contiguous");
  const bool int8_cache = k_cache.scalar_type() == at::kChar;
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.dim() == 4 &&
                  k_cache.sizes() == v_cache.sizes() && k_cache.size(0) == kv_heads &&
                  k_cache.size(3) == llm_serve::cache_row(head_dim, int8_cache),
              "caches: [kv_heads, blocks, block_size, head_dim (+ 4 for int8)], contiguous");
  TORCH_CHECK(slot_mapping.is_contiguous() && slot_mapping.scalar_type() == at::kLong && slot_mapping.numel() == tokens,
              "slot_mapping: [tokens] int64");
  const auto dtype = qk.scalar_type();
  TORCH_CHECK(v.scalar_type() == dtype && cos.scalar_type() == dtype && sin.scalar_type() == dtype &&
                  v_cache.scalar_type() == k_cache.scalar_type() && (int8_cache || k_cache.scalar_type() == dtype),
              "qk, v, cos, sin in one dtype, the caches in it too or both int8");
  at::Tensor q_out = at::empty({tokens, heads, head_dim}, qk.options());
  at::Tensor k_out = at::empty({tokens, kv_heads, head_dim}, qk.options());
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  if (dtype == at::kBFloat16 && int8_cache)
    rope_write<at::BFloat16, int8_t>(qk, v, cos, sin, k_cache, v_cache, slots, heads, q_out, k_out);
  else if (dtype == at::kBFloat16)
    rope_write<at::BFloat16, at::BFloat16>(qk, v, cos, sin, k_cache, v_cache, slots, heads, q_out, k_out);
  else if (dtype == at::kFloat && int8_cache)
    rope_write<float, int8_t>(qk, v, cos, sin, k_cache, v_cache, slots, heads, q_out, k_out);
  else if (dtype == at::kFloat)
    rope_write<float, float>(qk, v, cos, sin, k_cache, v_cache, slots, heads, q_out, k_out);
  else
    TORCH_CHECK(false, "rope_write_kv: float32 or bfloat16");
  return {q_out, k_out};
}
