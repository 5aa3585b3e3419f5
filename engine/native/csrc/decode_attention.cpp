// Paged decode attention on the CPU: one query row per sequence, K/V read in place from the
// paged cache through the block table (no gather copy), the query heads of a GQA group sharing
// each K/V row they read, long contexts split into fixed-size key ranges that run in parallel
// and are merged with their softmax statistics (Flash-Decoding).
//
// Shapes: q [num_seqs, heads, head_dim]; k_cache, v_cache [kv_heads, num_blocks, block_size,
// head_dim] (contiguous); block_tables [num_seqs, max_blocks] int32; seq_lens [num_seqs] int32
// (keys 0..seq_len-1 of each sequence); out [num_seqs, heads, head_dim], q's dtype. Scores,
// softmax and the weighted sum are float32; each split's work depends only on its own sequence,
// so a row's result does not depend on the batch.
//
// With AVX-512 and head_dim 64 or 128, keys go 16 at a time: their bf16 rows widened once into
// an L1 buffer shared by the group's heads, 16 scores in one vector (a transposing reduction),
// one vector exp per head, and the weighted sum of V kept in registers per 16 dimensions.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "vec16.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

// keys per parallel split of one (sequence, kv head): small enough that one sequence's few kv
// heads still give every thread work, large enough that merging the splits costs nothing
constexpr int64_t kSplitKeys = 128;
constexpr int64_t kMaxGroup = 16;   // query heads per kv head handled in registers
constexpr int64_t kMaxHeadDim = 256;

template <typename T>
inline float to_float(T x) { return static_cast<float>(x); }

#if defined(__AVX512F__)
using llm_serve::exp16;
using llm_serve::load16;
#endif

// sum over d of a[d] * b[d] (a float32, b the cache's type)
template <typename T>
inline float dot(const float* a, const T* b, int64_t n) {
#if defined(__AVX512F__)
  if (n % 16 == 0) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t d = 0; d < n; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), load16(b + d), acc);
    return _mm512_reduce_add_ps(acc);
  }
#endif
  float s = 0.f;
  for (int64_t d = 0; d < n; ++d) s += a[d] * to_float(b[d]);
  return s;
}

// acc[d] = acc[d] * scale + p * v[d]
template <typename T>
inline void scale_add(float* acc, float scale, float p, const T* v, int64_t n) {
#if defined(__AVX512F__)
  if (n % 16 == 0) {
    const __m512 sv = _mm512_set1_ps(scale), pv = _mm512_set1_ps(p);
    for (int64_t d = 0; d < n; d += 16)
      _mm512_storeu_ps(acc + d, _mm512_fmadd_ps(pv, load16(v + d), _mm512_mul_ps(sv, _mm512_loadu_ps(acc + d))));
    return;
  }
#endif
  for (int64_t d = 0; d < n; ++d) acc[d] = acc[d] * scale + p * to_float(v[d]);
}

template <typename T>
void attend_split(const T* q, const T* k_cache, const T* v_cache, const int32_t* table, int64_t begin,
                  int64_t end, int64_t group, int64_t head_dim, int64_t block_size, int64_t kv_head_stride,
                  float scale, float* acc, float* max_out, float* sum_out) {
  // q: [group, head_dim] of this kv head; acc: [group, head_dim]; max_out/sum_out: [group]
  float qf[kMaxGroup][kMaxHeadDim];
  for (int64_t g = 0; g < group; ++g)
    for (int64_t d = 0; d < head_dim; ++d) qf[g][d] = to_float(q[g * head_dim + d]) * scale;
  float m[kMaxGroup], l[kMaxGroup];
  for (int64_t g = 0; g < group; ++g) {
    m[g] = -std::numeric_limits<float>::infinity();
    l[g] = 0.f;
    for (int64_t d = 0; d < head_dim; ++d) acc[g * head_dim + d] = 0.f;
  }
  // one KV block at a time: its scores for every head of the group, one rescale per block
  float scores[kMaxGroup][64];
  for (int64_t t0 = begin; t0 < end; t0 = (t0 / block_size + 1) * block_size) {
    const int64_t t1 = std::min<int64_t>(end, (t0 / block_size + 1) * block_size);
    const int64_t n = t1 - t0;
    const int64_t base = (static_cast<int64_t>(table[t0 / block_size]) * block_size + t0 % block_size) * head_dim;
    const T* kblock = k_cache + kv_head_stride + base;
    const T* vblock = v_cache + kv_head_stride + base;
    for (int64_t j = 0; j < n; ++j) {
      const T* krow = kblock + j * head_dim;
      for (int64_t g = 0; g < group; ++g) scores[g][j] = dot(qf[g], krow, head_dim);
    }
    for (int64_t g = 0; g < group; ++g) {
      float block_max = m[g];
      for (int64_t j = 0; j < n; ++j) block_max = std::max(block_max, scores[g][j]);
      float* a = acc + g * head_dim;
      float rescale = 1.f;
      if (block_max > m[g]) {  // what was summed under the old maximum
        rescale = std::exp(m[g] - block_max);
        l[g] *= rescale;
        m[g] = block_max;
      }
      for (int64_t j = 0; j < n; ++j) {
        const float p = std::exp(scores[g][j] - m[g]);
        l[g] += p;
        scale_add(a, j == 0 ? rescale : 1.f, p, vblock + j * head_dim, head_dim);
      }
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    max_out[g] = m[g];
    sum_out[g] = l[g];
  }
}

#if defined(__AVX512F__)
constexpr int kChunk = 16;  // keys per vector of scores

// r[j] = the sum of the 16 lanes of v[j], j = 0..15 (pairs, then quads within 128-bit lanes,
// then across them)
inline __m512 sum_lanes16(const __m512* v) {
  __m512 a[8], b[4];
  for (int i = 0; i < 8; ++i)
    a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)
    b[i] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44), _mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0xEE));
  const __m512 c0 = _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], 0x88), _mm512_shuffle_f32x4(b[0], b[1], 0xDD));
  const __m512 c1 = _mm512_add_ps(_mm512_shuffle_f32x4(b[2], b[3], 0x88), _mm512_shuffle_f32x4(b[2], b[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(c0, c1, 0x88), _mm512_shuffle_f32x4(c0, c1, 0xDD));
}

// attend_split for head_dim = 16 * C, in vectors (same arguments)
template <typename T, int C>
void attend_split_vec(const T* q, const T* k_cache, const T* v_cache, const int32_t* table, int64_t begin,
                      int64_t end, int64_t group, int64_t block_size, int64_t kv_head_stride, float scale,
                      float* acc, float* max_out, float* sum_out) {
  constexpr int64_t head_dim = 16 * C;
#if defined(__AVX512BF16__)
  // bf16 scores straight from the cache's rows: q . k in VDPBF16PS (exact products, float32
  // sums), scaled afterwards
  constexpr bool kDotBf16 = std::is_same_v<T, at::BFloat16>;
#else
  constexpr bool kDotBf16 = false;
#endif
  alignas(64) float qf[kMaxGroup][head_dim];
  alignas(64) float kf[kDotBf16 ? 1 : kChunk][head_dim];
  alignas(64) float vf[kChunk][head_dim];
  alignas(64) float p[kChunk];
  float m[kMaxGroup], l[kMaxGroup];
  for (int64_t g = 0; g < group; ++g) {
    for (int c = 0; c < C; ++c) {
      if constexpr (!kDotBf16)
        _mm512_store_ps(qf[g] + 16 * c, _mm512_mul_ps(load16(q + g * head_dim + 16 * c), _mm512_set1_ps(scale)));
      _mm512_storeu_ps(acc + g * head_dim + 16 * c, _mm512_setzero_ps());
    }
    m[g] = -std::numeric_limits<float>::infinity();
    l[g] = 0.f;
  }
  for (int64_t t0 = begin; t0 < end;) {  // chunks of up to 16 keys within one block
    const int64_t t1 = std::min<int64_t>({end, (t0 / block_size + 1) * block_size, t0 + kChunk});
    const int n = static_cast<int>(t1 - t0);
    const int64_t base = (static_cast<int64_t>(table[t0 / block_size]) * block_size + t0 % block_size) * head_dim;
    const T* krows = k_cache + kv_head_stride + base;
    const T* vrows = v_cache + kv_head_stride + base;
    for (int j = 0; j < n; ++j)
      for (int c = 0; c < C; ++c) {
        if constexpr (!kDotBf16) _mm512_store_ps(kf[j] + 16 * c, load16(krows + j * head_dim + 16 * c));
        _mm512_store_ps(vf[j] + 16 * c, load16(vrows + j * head_dim + 16 * c));
      }
    const __mmask16 valid = static_cast<__mmask16>((1u << n) - 1);
    for (int64_t g = 0; g < group; ++g) {
      __m512 parts[kChunk];
      if constexpr (kDotBf16) {
#if defined(__AVX512BF16__)
        __m512bh qv[C / 2];
        for (int c = 0; c < C / 2; ++c)
          qv[c] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(q + g * head_dim + 32 * c));
        for (int j = 0; j < kChunk; ++j) {
          __m512 s = _mm512_setzero_ps();
          if (j < n)
            for (int c = 0; c < C / 2; ++c)
              s = _mm512_dpbf16_ps(s, qv[c], reinterpret_cast<__m512bh>(
                                                 _mm512_loadu_si512(krows + j * head_dim + 32 * c)));
          parts[j] = s;
        }
#endif
      } else {
        __m512 qv[C];
        for (int c = 0; c < C; ++c) qv[c] = _mm512_load_ps(qf[g] + 16 * c);
        for (int j = 0; j < kChunk; ++j) {
          __m512 s = _mm512_setzero_ps();
          if (j < n)
            for (int c = 0; c < C; ++c) s = _mm512_fmadd_ps(qv[c], _mm512_load_ps(kf[j] + 16 * c), s);
          parts[j] = s;
        }
      }
      __m512 dots = sum_lanes16(parts);
      if constexpr (kDotBf16) dots = _mm512_mul_ps(dots, _mm512_set1_ps(scale));
      const __m512 scores = _mm512_mask_blend_ps(valid, _mm512_set1_ps(-std::numeric_limits<float>::infinity()), dots);
      const float new_max = std::max(m[g], _mm512_reduce_max_ps(scores));
      const float rescale = std::exp(m[g] - new_max);  // what was summed under the old maximum (0 at first)
      const __m512 probs = _mm512_maskz_mov_ps(valid, exp16(_mm512_sub_ps(scores, _mm512_set1_ps(new_max))));
      m[g] = new_max;
      l[g] = l[g] * rescale + _mm512_reduce_add_ps(probs);
      _mm512_store_ps(p, probs);
      float* a = acc + g * head_dim;
      for (int c = 0; c < C; ++c) {
        __m512 av = _mm512_mul_ps(_mm512_loadu_ps(a + 16 * c), _mm512_set1_ps(rescale));
        for (int j = 0; j < n; ++j) av = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_load_ps(vf[j] + 16 * c), av);
        _mm512_storeu_ps(a + 16 * c, av);
      }
    }
    t0 = t1;
  }
  for (int64_t g = 0; g < group; ++g) {
    max_out[g] = m[g];
    sum_out[g] = l[g];
  }
}
#endif

// one (sequence, kv head, key range) with the kernel for its head size
template <typename T>
void attend(const T* q, const T* k_cache, const T* v_cache, const int32_t* table, int64_t begin, int64_t end,
            int64_t group, int64_t head_dim, int64_t block_size, int64_t kv_head_stride, float scale, float* acc,
            float* max_out, float* sum_out) {
#if defined(__AVX512F__)
  if (head_dim == 64)
    return attend_split_vec<T, 4>(q, k_cache, v_cache, table, begin, end, group, block_size, kv_head_stride, scale,
                                  acc, max_out, sum_out);
  if (head_dim == 128)
    return attend_split_vec<T, 8>(q, k_cache, v_cache, table, begin, end, group, block_size, kv_head_stride, scale,
                                  acc, max_out, sum_out);
#endif
  attend_split(q, k_cache, v_cache, table, begin, end, group, head_dim, block_size, kv_head_stride, scale, acc,
               max_out, sum_out);
}

template <typename T>
void decode_attention_impl(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale,
                           at::Tensor& out) {
  const int64_t num_seqs = q.size(0), num_heads = q.size(1), head_dim = q.size(2);
  const int64_t num_kv_heads = k_cache.size(0), block_size = k_cache.size(2);
  const int64_t group = num_heads / num_kv_heads;
  const int64_t max_blocks = block_tables.size(1);
  const int64_t kv_head_stride = k_cache.stride(0);
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  // work items: (sequence, kv head, split); each writes its own partial results
  std::vector<int64_t> first_split(num_seqs + 1, 0);
  for (int64_t s = 0; s < num_seqs; ++s)
    first_split[s + 1] = first_split[s] + std::max<int64_t>(1, (lens[s] + kSplitKeys - 1) / kSplitKeys);
  const int64_t num_splits = first_split[num_seqs];
  auto opts = at::TensorOptions().dtype(at::kFloat);
  at::Tensor acc = at::empty({num_splits, num_kv_heads, group, head_dim}, opts);
  at::Tensor maxes = at::empty({num_splits, num_kv_heads, group}, opts);
  at::Tensor sums = at::empty({num_splits, num_kv_heads, group}, opts);
  const T* qp = q.data_ptr<T>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  float* accp = acc.data_ptr<float>();
  float* maxp = maxes.data_ptr<float>();
  float* sump = sums.data_ptr<float>();
  at::parallel_for(0, num_splits * num_kv_heads, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t split = item / num_kv_heads, h = item % num_kv_heads;
      const int64_t seq = std::upper_bound(first_split.begin(), first_split.end(), split) - first_split.begin() - 1;
      const int64_t index_in_seq = split - first_split[seq];
      const int64_t begin = index_in_seq * kSplitKeys;
      const int64_t end = std::min<int64_t>(lens[seq], begin + kSplitKeys);
      const int64_t slot = split * num_kv_heads + h;
      attend(qp + (seq * num_heads + h * group) * head_dim, kp, vp, tables + seq * max_blocks, begin, end,
             group, head_dim, block_size, h * kv_head_stride, static_cast<float>(scale),
             accp + slot * group * head_dim, maxp + slot * group, sump + slot * group);
    }
  });
  // merge each sequence's splits in order (in one thread for a few sequences: a parallel region
  // costs more than their merge)
  T* op = out.data_ptr<T>();
  at::parallel_for(0, num_seqs * num_kv_heads, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t seq = item / num_kv_heads, h = item % num_kv_heads;
      for (int64_t g = 0; g < group; ++g) {
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t sp = first_split[seq]; sp < first_split[seq + 1]; ++sp)
          m = std::max(m, maxp[(sp * num_kv_heads + h) * group + g]);
        float total = 0.f;
        float o[kMaxHeadDim] = {0.f};
        for (int64_t sp = first_split[seq]; sp < first_split[seq + 1]; ++sp) {
          const int64_t slot = (sp * num_kv_heads + h) * group + g;
          const float w = std::exp(maxp[slot] - m);
          total += w * sump[slot];
          const float* a = accp + slot * head_dim;
          for (int64_t d = 0; d < head_dim; ++d) o[d] += w * a[d];
        }
        T* dst = op + (seq * num_heads + h * group + g) * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) dst[d] = static_cast<T>(o[d] / total);
      }
    }
  });
}

}  // namespace

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                     const at::Tensor& v_cache, const at::Tensor& block_tables,
                                     const at::Tensor& seq_lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), "bad shapes");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(), "inputs must be contiguous");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt,
              "block_tables and seq_lens must be int32");
  TORCH_CHECK(q.size(1) % k_cache.size(0) == 0 && q.size(1) / k_cache.size(0) <= kMaxGroup, "unsupported GQA group");
  TORCH_CHECK(q.size(2) <= kMaxHeadDim && q.size(2) == k_cache.size(3), "unsupported head_dim");
  TORCH_CHECK(k_cache.size(2) <= 64, "block_size above 64");
  auto tables = block_tables.contiguous();
  auto lens = seq_lens.contiguous();
  auto out = at::empty_like(q);
  if (q.scalar_type() == at::kBFloat16) {
    decode_attention_impl<at::BFloat16>(q, k_cache, v_cache, tables, lens, scale, out);
  } else if (q.scalar_type() == at::kFloat) {
    decode_attention_impl<float>(q, k_cache, v_cache, tables, lens, scale, out);
  } else {
    TORCH_CHECK(false, "paged_decode_attention: float32 or bfloat16");
  }
  return out;
}
