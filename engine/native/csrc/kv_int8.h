// The int8 KV cache's rows (--kv-cache-dtype int8), shared by the KV write (rope_kv.cpp) and
// decode attention (decode_attention.cpp); engine/attention/kv_int8.py is the same codec in torch.
//
// One row per (token, kv head): head_dim int8 codes, then the row's float32 scale in the next 4
// bytes (so a cache is int8 [kv_heads, blocks, block_size, head_dim + 4] and a slot addresses a
// row as for a bf16 cache):
//
//     scale = max |x| / 127     q = round_half_even(x / scale)  (q = 0 where scale = 0)
//     x' = T(float(q) * scale)  (T the model's dtype: float32, or bfloat16 rounded to nearest even)
//
// The same float32 operations as the torch codec, so both write and read identical bytes.
#pragma once

#include "aten.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "vec16.h"

namespace llm_serve {

constexpr int64_t kInt8ScaleBytes = 4;

// elements of one cache row: head_dim, and for an int8 cache its scale's bytes too
inline int64_t cache_row(int64_t head_dim, bool int8_cache) { return head_dim + (int8_cache ? kInt8ScaleBytes : 0); }

inline float int8_row_scale(const int8_t* row, int64_t head_dim) {
  float scale;
  std::memcpy(&scale, row + head_dim, sizeof(scale));
  return scale;
}

// x [head_dim] -> row [head_dim + 4]
template <typename T>
inline void quantize_int8_row(const T* x, int8_t* row, int64_t head_dim) {
  float amax = 0.f;
  for (int64_t d = 0; d < head_dim; ++d) amax = std::max(amax, std::fabs(static_cast<float>(x[d])));
  const float scale = amax / 127.f;
  const float divisor = scale == 0.f ? 1.f : scale;
  for (int64_t d = 0; d < head_dim; ++d) {
    const float q = std::nearbyint(static_cast<float>(x[d]) / divisor);  // ties to even (the default mode)
    row[d] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, q)));
  }
  std::memcpy(row + head_dim, &scale, sizeof(scale));
}

// row [head_dim + 4] -> out [head_dim], in T
template <typename T>
inline void dequantize_int8_row(const int8_t* row, T* out, int64_t head_dim) {
  const float scale = int8_row_scale(row, head_dim);
#if defined(LLM_SERVE_VEC16)
  if (head_dim % 16 == 0) {
    const f32x16 s = set16(scale);
    for (int64_t d = 0; d < head_dim; d += 16) store16(out + d, mul(load16(row + d), s));
    return;
  }
#endif
  for (int64_t d = 0; d < head_dim; ++d) out[d] = static_cast<T>(static_cast<float>(row[d]) * scale);
}

}  // namespace llm_serve
