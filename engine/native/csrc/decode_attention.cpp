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
// With AVX-512 and head_dim 64 or 128, keys go 16 at a time: 16 scores in one vector (a
// transposing reduction), one vector exp per head, the weighted sum of V in registers; a bf16
// cache is read by VDPBF16PS directly, one softmax per split (attend_split_bf16).
//
// An int8 cache (kv_int8.h: rows of head_dim codes + a float32 scale, [kv_heads, num_blocks,
// block_size, head_dim + 4]) is read a split at a time: its rows de-quantized into q's dtype in
// contiguous buffers, exactly as the torch codec does, which the kernel for q's dtype then
// attends as a cache of its own (attend_int8).
#include "aten.h"
#include <ATen/Parallel.h>

#include "amx_tiles.h"
#include "kv_int8.h"
#include "parallel.h"
#include "prefetch.h"
#include "vec16.h"

#include <algorithm>
#include <array>
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

#if defined(LLM_SERVE_VEC16)
using llm_serve::f32x16;
#endif

// sum over d of a[d] * b[d] (a float32, b the cache's type)
template <typename T>
inline float dot(const float* a, const T* b, int64_t n) {
#if defined(LLM_SERVE_VEC16)
  if (n % 16 == 0) {
    f32x16 acc = llm_serve::zero16();
    for (int64_t d = 0; d < n; d += 16) acc = llm_serve::fmadd(llm_serve::load16(a + d), llm_serve::load16(b + d), acc);
    return llm_serve::reduce_add(acc);
  }
#endif
  float s = 0.f;
  for (int64_t d = 0; d < n; ++d) s += a[d] * to_float(b[d]);
  return s;
}

// acc[d] = acc[d] * scale + p * v[d]
template <typename T>
inline void scale_add(float* acc, float scale, float p, const T* v, int64_t n) {
#if defined(LLM_SERVE_VEC16)
  if (n % 16 == 0) {
    const f32x16 sv = llm_serve::set16(scale), pv = llm_serve::set16(p);
    for (int64_t d = 0; d < n; d += 16)
      llm_serve::store16(acc + d, llm_serve::fmadd(pv, llm_serve::load16(v + d), llm_serve::mul(sv, llm_serve::load16(acc + d))));
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

// the cache lines of `bytes` bytes from `row`
inline void prefetch_row(const void* row, int64_t bytes) { llm_serve::prefetch_lines(row, bytes); }

// The K/V rows of the work item a thread runs next, as runs of consecutive rows (at most one K and
// one V run per block of a split), requested from memory a run at a time while the thread's
// current item runs: the bf16 kernel issues one every 16 keys it scores and every 16 keys of V it
// interleaves, so the misses of the next item are in flight through the whole current one
// instead of in one burst of 512 lines that stalls the core before it starts (32 sequences of
// 250 keys, 30 layers' caches, the AMD EPYC: 9.6-10.5 ms in a burst, 7.4-8.2 spread). Filled
// only where prefetches go to L2 (prefetch.h); one per thread, since the parallel loop fills it
// and the kernel it calls drains it.
class NextItemRows {
 public:
  void add(const void* start, int64_t bytes) {
    start_[count_] = start;
    bytes_[count_] = bytes;
    ++count_;
  }
  // request the next `runs` runs not yet requested
  void issue(int runs) {
    for (; runs > 0 && issued_ < count_; --runs, ++issued_) llm_serve::prefetch_lines(start_[issued_], bytes_[issued_]);
  }
  // request the rest, and start over empty
  void finish() {
    issue(count_);
    clear();
  }
  void clear() { count_ = issued_ = 0; }

 private:
  const void* start_[2 * kSplitKeys];
  int64_t bytes_[2 * kSplitKeys];
  int count_ = 0, issued_ = 0;
};
thread_local NextItemRows next_item_rows;

#if !defined(__AVX512BF16__)
constexpr bool kBf16Dot = false;
#endif

#if defined(LLM_SERVE_VEC16)
constexpr int kChunk = 16;  // keys per vector of scores

// r[j] = the sum of the 16 lanes of v[j], j = 0..15
inline f32x16 sum_lanes16(const f32x16* v) {
  return llm_serve::reduce_lanes16(v, [](f32x16 a, f32x16 b) { return llm_serve::add(a, b); });
}

// One chunk's step of the online softmax: scores of the chunk's n keys (lanes past them ignored) ->
// the weights exp(score - new max), 0 past the keys; `max` moves to the new maximum and `rescale` is
// what to multiply the sums so far by (0 at the first chunk).
inline f32x16 softmax_chunk(f32x16 scores, int n, float& max, float& rescale) {
  scores = llm_serve::first_lanes(scores, n, -std::numeric_limits<float>::infinity());
  const float new_max = std::max(max, llm_serve::reduce_max(scores));
  rescale = new_max > max ? std::exp(max - new_max) : 1.f;  // most chunks leave the maximum where it was
  max = new_max;
  return llm_serve::first_lanes(llm_serve::exp16(llm_serve::sub(scores, llm_serve::set16(new_max))), n);
}

// Chunks ahead of the one being attended whose K/V rows are requested from memory first: the
// blocks lie anywhere in the cache, so the hardware prefetcher meets a new stream every block and
// an attention that waits for each would run at a fraction of the bandwidth.
constexpr int kPrefetchChunks = 2;

// Chunks of up to 16 keys within one block, [t0, t1) from begin to end: fn(first key's row offset, n),
// after prefetch(row offset, n) of the chunk kPrefetchChunks ahead
template <typename Fn, typename Prefetch>
inline void for_each_chunk(const int32_t* table, int64_t begin, int64_t end, int64_t block_size, int64_t head_dim,
                           Fn fn, Prefetch prefetch) {
  const auto chunk_end = [&](int64_t t0) {
    return std::min<int64_t>({end, (t0 / block_size + 1) * block_size, t0 + kChunk});
  };
  const auto offset = [&](int64_t t0) {
    return (static_cast<int64_t>(table[t0 / block_size]) * block_size + t0 % block_size) * head_dim;
  };
  int64_t ahead = begin;  // the first key not yet prefetched
  const auto prefetch_next = [&]() {
    if (ahead < end) {
      const int64_t t1 = chunk_end(ahead);
      prefetch(offset(ahead), static_cast<int>(t1 - ahead));
      ahead = t1;
    }
  };
  for (int i = 0; i < kPrefetchChunks; ++i) prefetch_next();
  for (int64_t t0 = begin; t0 < end;) {
    const int64_t t1 = chunk_end(t0);
    prefetch_next();
    fn(offset(t0), static_cast<int>(t1 - t0));
    t0 = t1;
  }
}

// the cache lines of n consecutive K and V rows of `row_bytes` each from `k` and `v`
inline void prefetch_rows(const void* k, const void* v, int n, int64_t row_bytes) {
  prefetch_row(k, n * row_bytes);
  prefetch_row(v, n * row_bytes);
}

// attend_split in vectors, for a cache of T (float32, or bfloat16 where the CPU has no bf16 dot
// product), head_dim = 16 * C (same arguments): K and V rows read as vectors, 16 scores per
// reduction, the weighted sum in registers per 16 dimensions
template <typename T, int C>
void attend_split_vec(const T* q, const T* k_cache, const T* v_cache, const int32_t* table, int64_t begin,
                      int64_t end, int64_t group, int64_t block_size, int64_t kv_head_stride, float scale, float* acc,
                      float* max_out, float* sum_out) {
  using namespace llm_serve;  // NOLINT: the vector functions (vec16.h)
  constexpr int64_t head_dim = 16 * C;
  alignas(64) float p[kChunk];
  for (int64_t g = 0; g < group; ++g) {
    for (int c = 0; c < C; ++c) store16(acc + g * head_dim + 16 * c, zero16());
    max_out[g] = -std::numeric_limits<float>::infinity();
    sum_out[g] = 0.f;
  }
  for_each_chunk(table, begin, end, block_size, head_dim, [&](int64_t base, int n) {
    const T* krows = k_cache + kv_head_stride + base;
    const T* vrows = v_cache + kv_head_stride + base;
    for (int64_t g = 0; g < group; ++g) {
      f32x16 qv[C], parts[kChunk];
      for (int c = 0; c < C; ++c) qv[c] = mul(load16(q + g * head_dim + 16 * c), set16(scale));
      for (int j = 0; j < kChunk; ++j) {
        f32x16 s = zero16();
        if (j < n)
          for (int c = 0; c < C; ++c) s = fmadd(qv[c], load16(krows + j * head_dim + 16 * c), s);
        parts[j] = s;
      }
      float rescale;
      const f32x16 probs = softmax_chunk(sum_lanes16(parts), n, max_out[g], rescale);
      sum_out[g] = sum_out[g] * rescale + reduce_add(probs);
      store16(p, probs);
      float* a = acc + g * head_dim;
      for (int c = 0; c < C; ++c) {
        f32x16 av = mul(load16(a + 16 * c), set16(rescale));
        for (int j = 0; j < n; ++j) av = fmadd(set16(p[j]), load16(vrows + j * head_dim + 16 * c), av);
        store16(a + 16 * c, av);
      }
    }
  }, [&](int64_t base, int n) {
    prefetch_rows(k_cache + kv_head_stride + base, v_cache + kv_head_stride + base, n, head_dim * sizeof(T));
  });
}
#endif  // LLM_SERVE_VEC16

#if defined(__AVX512BF16__)
constexpr bool kBf16Dot = true;  // bf16 caches read by VDPBF16PS (attend_split_bf16)
using llm_serve::exp16;
using llm_serve::load16;

// Keys ahead of the one being scored whose K rows are requested from memory first.
constexpr int kPrefetchKeys = 64;

// krow[t], vrow[t]: the K and V rows of key begin + t, t < n, of one kv head; the first
// kPrefetchKeys K rows requested from memory
inline void row_pointers(const at::BFloat16* k_cache, const at::BFloat16* v_cache, const int32_t* table,
                         int64_t begin, int n, int64_t block_size, int64_t head_dim, int64_t kv_head_stride,
                         const at::BFloat16** krow, const at::BFloat16** vrow) {
  for (int t = 0; t < n;) {  // a block at a time: one division per block, not per key
    const int64_t key = begin + t, in_block = key % block_size;
    const int64_t offset = (static_cast<int64_t>(table[key / block_size]) * block_size + in_block) * head_dim;
    const int run = static_cast<int>(std::min<int64_t>(n - t, block_size - in_block));
    for (int j = 0; j < run; ++j) {
      krow[t + j] = k_cache + kv_head_stride + offset + j * head_dim;
      vrow[t + j] = v_cache + kv_head_stride + offset + j * head_dim;
    }
    t += run;
  }
  const int64_t row_bytes = head_dim * static_cast<int64_t>(sizeof(at::BFloat16));
  for (int t = 0; t < std::min(n, kPrefetchKeys); ++t) prefetch_row(krow[t], row_bytes);
}

// One softmax per head over a split's n scores (scores[g], -inf past n up to the 16-key chunk's
// end; no running maximum to rescale by): the weights exp(score - max) rounded to bf16 (as the
// torch path rounds its probabilities) into weights[g], 0 past n up to the chunk's end, their sum
// taken over the rounded ones.
inline void softmax_weights(const float (*scores)[kSplitKeys], int n, int64_t group, uint16_t (*weights)[kSplitKeys],
                            float* max_out, float* sum_out) {
  const int chunks = (n + kChunk - 1) / kChunk;
  for (int64_t g = 0; g < group; ++g) {
    __m512 running = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int ch = 0; ch < chunks; ++ch) running = _mm512_max_ps(running, _mm512_load_ps(scores[g] + ch * kChunk));
    const float max = _mm512_reduce_max_ps(running);
    __m512 total = _mm512_setzero_ps();
    for (int ch = 0; ch < chunks; ++ch) {
      const int j0 = ch * kChunk;
      const __mmask16 valid = static_cast<__mmask16>((1u << std::min(kChunk, n - j0)) - 1);
      const __m512 e = _mm512_maskz_mov_ps(valid, exp16(_mm512_sub_ps(_mm512_load_ps(scores[g] + j0),
                                                                      _mm512_set1_ps(max))));
      const __m256i rounded = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(e));
      _mm256_store_si256(reinterpret_cast<__m256i*>(weights[g] + j0), rounded);
      total = _mm512_add_ps(total, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(rounded), 16)));
    }
    max_out[g] = max;
    sum_out[g] = _mm512_reduce_add_ps(total);
  }
}

// A vector of 32 dimensions as two accumulators back in dimension order: V rows interleaved key
// by key with unpacklo / unpackhi leave, per 32 dimensions, 128-bit lanes of dimensions 0-3,
// 8-11, 16-19, 24-27 in `lo` and 4-7, 12-15, 20-23, 28-31 in `hi`
inline void store_unpacked(float* a, __m512 lo, __m512 hi) {
  const __m512 first = _mm512_shuffle_f32x4(lo, hi, 0x44), second = _mm512_shuffle_f32x4(lo, hi, 0xEE);
  _mm512_storeu_ps(a, _mm512_shuffle_f32x4(first, first, 0xD8));
  _mm512_storeu_ps(a + 16, _mm512_shuffle_f32x4(second, second, 0xD8));
}

// attend_split for a bfloat16 cache, head_dim = 32 * C2 (same arguments), in three passes over
// the split's keys (at most kSplitKeys), all in VDPBF16PS on the cache's own rows:
// 1. scores q . k (exact products, float32 sums) times scale, 16 keys per transposing reduction,
//    for every head of the group; the V rows are requested while the K rows are read;
// 2. one softmax per head over the whole split (no running maximum to rescale by): the weights
//    exp(score - max) rounded to bf16 (as the torch path rounds its probabilities), their sum
//    taken over the rounded ones;
// 3. the weighted sum of V: two keys' rows interleaved word by word (once, shared by the group's
//    heads) against their two weights as a bf16 pair, so one instruction adds p_j v_j +
//    p_j+1 v_j+1 for 16 dimensions, with the sums in registers for the whole split. The
//    interleave leaves the dimensions of each 32 in the order of unpacklo / unpackhi, put back
//    at the store.
template <int C2>
void attend_split_bf16(const at::BFloat16* q, const at::BFloat16* k_cache, const at::BFloat16* v_cache,
                       const int32_t* table, int64_t begin, int64_t end, int64_t group, int64_t block_size,
                       int64_t kv_head_stride, float scale, float* acc, float* max_out, float* sum_out) {
  constexpr int64_t head_dim = 32 * C2;
  constexpr int64_t row_bytes = head_dim * static_cast<int64_t>(sizeof(at::BFloat16));
  const int n = static_cast<int>(end - begin);
  const at::BFloat16* krow[kSplitKeys];
  const at::BFloat16* vrow[kSplitKeys];
  row_pointers(k_cache, v_cache, table, begin, n, block_size, head_dim, kv_head_stride, krow, vrow);
  NextItemRows& next_rows = next_item_rows;  // (one thread-local lookup, not one per use)

  // 1. scores [group][keys], -inf past the split's keys up to the chunk's end
  alignas(64) float scores[kMaxGroup][kSplitKeys];
  __m512bh qv[kMaxGroup][C2];
  for (int64_t g = 0; g < group; ++g)
    for (int c = 0; c < C2; ++c) qv[g][c] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(q + g * head_dim + 32 * c));
  const int chunks = (n + kChunk - 1) / kChunk;
  for (int ch = 0; ch < chunks; ++ch) {
    const int j0 = ch * kChunk, m = std::min(kChunk, n - j0);
    for (int j = j0; j < j0 + m; ++j) {
      prefetch_row(vrow[j], row_bytes);
      if (j + kPrefetchKeys < n) prefetch_row(krow[j + kPrefetchKeys], row_bytes);
    }
    next_rows.issue(1);
    const __mmask16 valid = static_cast<__mmask16>((1u << m) - 1);
    for (int64_t g = 0; g < group; ++g) {
      __m512 parts[kChunk];
      for (int j = 0; j < kChunk; ++j) {
        __m512 s = _mm512_setzero_ps();
        if (j < m)
          for (int c = 0; c < C2; ++c)
            s = _mm512_dpbf16_ps(s, qv[g][c], reinterpret_cast<__m512bh>(_mm512_loadu_si512(krow[j0 + j] + 32 * c)));
        parts[j] = s;
      }
      _mm512_store_ps(scores[g] + j0,
                      _mm512_mask_blend_ps(valid, _mm512_set1_ps(-std::numeric_limits<float>::infinity()),
                                           _mm512_mul_ps(sum_lanes16(parts), _mm512_set1_ps(scale))));
    }
  }

  // 2. weights [group][keys] as bf16, 0 past the split's keys
  alignas(64) uint16_t weights[kMaxGroup][kSplitKeys];
  softmax_weights(scores, n, group, weights, max_out, sum_out);

  // 3. acc [group][head_dim] = sum over keys of weight * V row
  const int num_pairs = (n + 1) / 2;
  __m512i pairs[kSplitKeys / 2][C2][2];  // [key pair][32 dimensions][unpacklo, unpackhi]
  for (int jp = 0; jp < num_pairs; ++jp) {
    if (jp % 8 == 7) next_rows.issue(1);
    for (int c = 0; c < C2; ++c) {
      const __m512i a = _mm512_loadu_si512(vrow[2 * jp] + 32 * c);
      const __m512i b = 2 * jp + 1 < n ? _mm512_loadu_si512(vrow[2 * jp + 1] + 32 * c) : _mm512_setzero_si512();
      pairs[jp][c][0] = _mm512_unpacklo_epi16(a, b);
      pairs[jp][c][1] = _mm512_unpackhi_epi16(a, b);
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    const uint32_t* weight_pairs = reinterpret_cast<const uint32_t*>(weights[g]);  // key 2jp in the low half
    __m512 av[2][2 * C2];  // two sets of sums, even and odd pairs: twice the independent chains
    for (int c = 0; c < 2 * C2; ++c) av[0][c] = av[1][c] = _mm512_setzero_ps();
    const auto add_pair = [&](__m512* sums, int jp) {
      const __m512bh w = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(weight_pairs[jp])));
      for (int c = 0; c < C2; ++c)
        for (int h = 0; h < 2; ++h)
          sums[2 * c + h] = _mm512_dpbf16_ps(sums[2 * c + h], reinterpret_cast<__m512bh>(pairs[jp][c][h]), w);
    };
    int jp = 0;
    for (; jp + 1 < num_pairs; jp += 2) {  // the two sets by a fixed index, so they stay in registers
      add_pair(av[0], jp);
      add_pair(av[1], jp + 1);
    }
    if (jp < num_pairs) add_pair(av[0], jp);
    for (int c = 0; c < C2; ++c)
      store_unpacked(acc + g * head_dim + 32 * c, _mm512_add_ps(av[0][2 * c], av[1][2 * c]),
                     _mm512_add_ps(av[0][2 * c + 1], av[1][2 * c + 1]));
  }
}

#if defined(LLM_SERVE_AMX)
// Set by TileScope in a thread whose tiles are configured (llm_serve::configure_tiles) for the
// kernel's parallel loop: attend then takes attend_split_amx for a bf16 cache.
thread_local bool amx_tiles_ready = false;

struct TileScope {
  explicit TileScope(bool use) : active(use) {
    if (active) {
      llm_serve::configure_tiles();
      amx_tiles_ready = true;
    }
  }
  ~TileScope() {
    if (active) {
      amx_tiles_ready = false;
      _tile_release();
    }
  }
  bool active;
};

// attend_split_bf16 on the matrix unit (same arguments and passes; tiles 16 rows x 64 bytes):
// 1. scores: 16 keys' K rows straight from the cache as an A tile (a row: 32 dimensions of one
//    key), q transposed into B tiles (row p: dimensions 2p, 2p + 1 of every head of the group,
//    heads past the group 0), so C = [16 keys][16 heads]; a head's 16 scores gathered from it;
// 2. the same softmax;
// 3. the weighted sum of V: the weights of 32 keys as an A tile ([16 heads][32 keys], heads past
//    the group 0), two keys' V rows interleaved word by word into B tiles (row p: keys 2p,
//    2p + 1 for 16 dimensions in unpacklo / unpackhi order), C = [16 heads][16 dimensions] per
//    B tile, summed over the split in the tiles.
// The products are exact and the sums float32, as in VDPBF16PS; only the order of the additions
// differs. Tiles: scores 0, 6 (K), 1..C2 (q), 5 (C); weighted sum 0 (weights), 1, 2 (V), 4..7
// (C), a pass per 64 dimensions.
template <int C2>
void attend_split_amx(const at::BFloat16* q, const at::BFloat16* k_cache, const at::BFloat16* v_cache,
                      const int32_t* table, int64_t begin, int64_t end, int64_t group, int64_t block_size,
                      int64_t kv_head_stride, float scale, float* acc, float* max_out, float* sum_out) {
  constexpr int64_t head_dim = 32 * C2;
  constexpr int64_t row_bytes = head_dim * static_cast<int64_t>(sizeof(at::BFloat16));
  const int n = static_cast<int>(end - begin);
  const at::BFloat16* krow[kSplitKeys];
  const at::BFloat16* vrow[kSplitKeys];
  row_pointers(k_cache, v_cache, table, begin, n, block_size, head_dim, kv_head_stride, krow, vrow);

  // 1. scores [group][keys], -inf past the split's keys up to the chunk's end
  alignas(64) uint32_t q_tiles[C2][16][16] = {};  // [32 dimensions][pair p][head]: q's bf16 pairs
  const auto* q_pairs = reinterpret_cast<const uint32_t*>(q);
  for (int c = 0; c < C2; ++c)
    for (int p = 0; p < 16; ++p)
      for (int64_t g = 0; g < group; ++g) q_tiles[c][p][g] = q_pairs[g * head_dim / 2 + 16 * c + p];
  _tile_loadd(1, q_tiles[0], 64);
  _tile_loadd(2, q_tiles[1], 64);
  if constexpr (C2 == 4) {
    _tile_loadd(3, q_tiles[2], 64);
    _tile_loadd(4, q_tiles[3], 64);
  }
  alignas(64) float scores[kMaxGroup][kSplitKeys];
  alignas(64) float key_scores[16 * 16];            // C: [key][head]
  alignas(64) at::BFloat16 staged[16 * head_dim];   // a chunk's K rows where they are not 16 in a row
  const __m512i head_column = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                 _mm512_set1_epi32(16));
  const int chunks = (n + kChunk - 1) / kChunk;
  for (int ch = 0; ch < chunks; ++ch) {
    const int j0 = ch * kChunk, m = std::min(kChunk, n - j0);
    for (int j = j0; j < j0 + m; ++j) {
      prefetch_row(vrow[j], row_bytes);
      if (j + kPrefetchKeys < n) prefetch_row(krow[j + kPrefetchKeys], row_bytes);
    }
    const at::BFloat16* keys = krow[j0];
    if (m < kChunk || krow[j0 + kChunk - 1] != krow[j0] + (kChunk - 1) * head_dim) {
      for (int j = 0; j < kChunk; ++j)
        for (int c = 0; c < C2; ++c)
          _mm512_store_si512(staged + j * head_dim + 32 * c,
                             j < m ? _mm512_loadu_si512(krow[j0 + j] + 32 * c) : _mm512_setzero_si512());
      keys = staged;
    }
    _tile_zero(5);
    _tile_loadd(0, keys, row_bytes);
    _tile_dpbf16ps(5, 0, 1);
    _tile_loadd(6, keys + 32, row_bytes);
    _tile_dpbf16ps(5, 6, 2);
    if constexpr (C2 == 4) {
      _tile_loadd(0, keys + 64, row_bytes);
      _tile_dpbf16ps(5, 0, 3);
      _tile_loadd(6, keys + 96, row_bytes);
      _tile_dpbf16ps(5, 6, 4);
    }
    _tile_stored(5, key_scores, 64);
    const __mmask16 valid = static_cast<__mmask16>((1u << m) - 1);
    for (int64_t g = 0; g < group; ++g) {
      const __m512 column = _mm512_i32gather_ps(_mm512_add_epi32(head_column, _mm512_set1_epi32(static_cast<int>(g))),
                                                key_scores, 4);
      _mm512_store_ps(scores[g] + j0, _mm512_mask_blend_ps(valid, _mm512_set1_ps(-std::numeric_limits<float>::infinity()),
                                                           _mm512_mul_ps(column, _mm512_set1_ps(scale))));
    }
  }

  // 2. weights [16][keys] as bf16: the group's heads, 0 past the split's keys up to a multiple of
  // 32 keys; the rows past the group 0
  alignas(64) uint16_t weights[kMaxGroup][kSplitKeys];
  softmax_weights(scores, n, group, weights, max_out, sum_out);
  const int blocks32 = (n + 31) / 32;
  if (chunks % 2)
    for (int64_t g = 0; g < group; ++g)
      _mm256_store_si256(reinterpret_cast<__m256i*>(weights[g] + chunks * kChunk), _mm256_setzero_si256());
  for (int64_t g = group; g < 16; ++g)
    for (int b = 0; b < blocks32; ++b) _mm512_store_si512(weights[g] + 32 * b, _mm512_setzero_si512());

  // 3. acc [group][head_dim] = sum over keys of weight * V row, 64 dimensions per pass
  alignas(64) uint16_t v_tiles[4][16][32];  // [16 dimensions][key pair][two keys' words]
  alignas(64) float sums[4][16 * 16];       // C: [head][16 dimensions]
  for (int half = 0; half < C2 / 2; ++half) {
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    for (int b = 0; b < blocks32; ++b) {
      for (int p = 0; p < 16; ++p) {
        const int ka = 32 * b + 2 * p, kb = ka + 1;
        for (int c = 0; c < 2; ++c) {
          const int64_t d = 64 * half + 32 * c;
          const __m512i va = ka < n ? _mm512_loadu_si512(vrow[ka] + d) : _mm512_setzero_si512();
          const __m512i vb = kb < n ? _mm512_loadu_si512(vrow[kb] + d) : _mm512_setzero_si512();
          _mm512_store_si512(v_tiles[2 * c][p], _mm512_unpacklo_epi16(va, vb));
          _mm512_store_si512(v_tiles[2 * c + 1][p], _mm512_unpackhi_epi16(va, vb));
        }
      }
      _tile_loadd(0, weights[0] + 32 * b, kSplitKeys * static_cast<int64_t>(sizeof(uint16_t)));
      _tile_loadd(1, v_tiles[0], 64);
      _tile_dpbf16ps(4, 0, 1);
      _tile_loadd(2, v_tiles[1], 64);
      _tile_dpbf16ps(5, 0, 2);
      _tile_loadd(1, v_tiles[2], 64);
      _tile_dpbf16ps(6, 0, 1);
      _tile_loadd(2, v_tiles[3], 64);
      _tile_dpbf16ps(7, 0, 2);
    }
    _tile_stored(4, sums[0], 64);
    _tile_stored(5, sums[1], 64);
    _tile_stored(6, sums[2], 64);
    _tile_stored(7, sums[3], 64);
    for (int64_t g = 0; g < group; ++g)
      for (int c = 0; c < 2; ++c)
        store_unpacked(acc + g * head_dim + 64 * half + 32 * c, _mm512_load_ps(sums[2 * c] + 16 * g),
                       _mm512_load_ps(sums[2 * c + 1] + 16 * g));
  }
}
#endif  // LLM_SERVE_AMX
#endif  // __AVX512BF16__

// one (sequence, kv head, key range) with the kernel for its dtype and head size
template <typename T>
void attend(const T* q, const T* k_cache, const T* v_cache, const int32_t* table, int64_t begin, int64_t end,
            int64_t group, int64_t head_dim, int64_t block_size, int64_t kv_head_stride, float scale, float* acc,
            float* max_out, float* sum_out) {
#if defined(LLM_SERVE_AMX)
  if constexpr (std::is_same_v<T, at::BFloat16>) {
    if (amx_tiles_ready && head_dim == 64)
      return attend_split_amx<2>(q, k_cache, v_cache, table, begin, end, group, block_size, kv_head_stride, scale,
                                 acc, max_out, sum_out);
    if (amx_tiles_ready && head_dim == 128)
      return attend_split_amx<4>(q, k_cache, v_cache, table, begin, end, group, block_size, kv_head_stride, scale,
                                 acc, max_out, sum_out);
  }
#endif
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, at::BFloat16>) {
    if (head_dim == 64)
      return attend_split_bf16<2>(q, k_cache, v_cache, table, begin, end, group, block_size, kv_head_stride, scale,
                                  acc, max_out, sum_out);
    if (head_dim == 128)
      return attend_split_bf16<4>(q, k_cache, v_cache, table, begin, end, group, block_size, kv_head_stride, scale,
                                  acc, max_out, sum_out);
  }
#endif
#if defined(LLM_SERVE_VEC16)
  if constexpr (std::is_same_v<T, float> || !kBf16Dot) {
    if (head_dim == 64)
      return attend_split_vec<T, 4>(q, k_cache, v_cache, table, begin, end, group, block_size, kv_head_stride, scale,
                                    acc, max_out, sum_out);
    if (head_dim == 128)
      return attend_split_vec<T, 8>(q, k_cache, v_cache, table, begin, end, group, block_size, kv_head_stride, scale,
                                    acc, max_out, sum_out);
  }
#endif
  attend_split(q, k_cache, v_cache, table, begin, end, group, head_dim, block_size, kv_head_stride, scale, acc,
               max_out, sum_out);
}

// Keys ahead of the one being de-quantized whose int8 K and V rows are requested from memory first.
constexpr int64_t kInt8PrefetchKeys = 16;
// Keys per block of the de-quantized buffers where the cache's blocks do not divide a split.
constexpr int64_t kBufferBlock = 16;

// attend over an int8 cache (same arguments; head_dim is q's, a cache row is head_dim + 4 bytes):
// the split's K and V rows de-quantized into per-thread buffers, then attend on those
template <typename T>
void attend_int8(const T* q, const int8_t* k_cache, const int8_t* v_cache, const int32_t* table, int64_t begin,
                 int64_t end, int64_t group, int64_t head_dim, int64_t block_size, int64_t kv_head_stride,
                 float scale, float* acc, float* max_out, float* sum_out) {
  thread_local std::vector<T> keys(kSplitKeys * kMaxHeadDim), values(kSplitKeys * kMaxHeadDim);
  const int64_t n = end - begin, row_bytes = llm_serve::cache_row(head_dim, true);
  const auto row = [&](int64_t t) {  // byte offset of key begin + t's row
    const int64_t key = begin + t;
    return kv_head_stride + (static_cast<int64_t>(table[key / block_size]) * block_size + key % block_size) * row_bytes;
  };
  for (int64_t t = 0; t < std::min(n, kInt8PrefetchKeys); ++t) {
    prefetch_row(k_cache + row(t), row_bytes);
    prefetch_row(v_cache + row(t), row_bytes);
  }
  for (int64_t t = 0; t < n; ++t) {
    if (t + kInt8PrefetchKeys < n) {
      prefetch_row(k_cache + row(t + kInt8PrefetchKeys), row_bytes);
      prefetch_row(v_cache + row(t + kInt8PrefetchKeys), row_bytes);
    }
    llm_serve::dequantize_int8_row(k_cache + row(t), keys.data() + t * head_dim, head_dim);
    llm_serve::dequantize_int8_row(v_cache + row(t), values.data() + t * head_dim, head_dim);
  }
  // the buffers in blocks of the cache's size where splits start on its blocks, so a kernel
  // whose sums follow the blocks adds in the same order as over a cache of q's dtype
  static const auto kBufferBlocks = [] {
    std::array<int32_t, kSplitKeys> ids{};
    for (int32_t i = 0; i < static_cast<int32_t>(kSplitKeys); ++i) ids[i] = i;
    return ids;
  }();
  const int64_t buffer_block = kSplitKeys % block_size == 0 ? block_size : kBufferBlock;
  attend(q, keys.data(), values.data(), kBufferBlocks.data(), 0, n, group, head_dim, buffer_block, 0, scale, acc,
         max_out, sum_out);
}

// The K and V rows of keys [begin, end) of one kv head, queued for next_item_rows a block's run
// of rows at a time. With only the kernel's own requests (64 keys ahead of the key it scores) a
// thread met each item's first rows cold; with these into L2 on the AMD EPYC, 32 sequences of
// 250 keys in 30 layers' caches took 7.4-8.2 ms against 12.8-15.0 (1 sequence of 1,100 keys
// 0.90-0.95 against 1.88 ms, 32 of 1,100 keys 31.6-35.8 against 58.9 ms).
template <typename C>
void queue_item_rows(const C* k_cache, const C* v_cache, const int32_t* table, int64_t begin, int64_t end,
                   int64_t block_size, int64_t row_elems, int64_t kv_head_offset) {
  const int64_t row_bytes = row_elems * static_cast<int64_t>(sizeof(C));
  for (int64_t t0 = begin; t0 < end; t0 = (t0 / block_size + 1) * block_size) {
    const int64_t t1 = std::min<int64_t>(end, (t0 / block_size + 1) * block_size);
    const int64_t offset =
        kv_head_offset + (static_cast<int64_t>(table[t0 / block_size]) * block_size + t0 % block_size) * row_elems;
    next_item_rows.add(k_cache + offset, (t1 - t0) * row_bytes);
    next_item_rows.add(v_cache + offset, (t1 - t0) * row_bytes);
  }
}

// attend for a cache of q's dtype (C = T) or an int8 one (C = int8_t)
template <typename T, typename C>
void attend_cached(const T* q, const C* k_cache, const C* v_cache, const int32_t* table, int64_t begin, int64_t end,
                   int64_t group, int64_t head_dim, int64_t block_size, int64_t kv_head_stride, float scale,
                   float* acc, float* max_out, float* sum_out) {
  if constexpr (std::is_same_v<C, int8_t>)
    attend_int8(q, k_cache, v_cache, table, begin, end, group, head_dim, block_size, kv_head_stride, scale, acc,
                max_out, sum_out);
  else
    attend(q, k_cache, v_cache, table, begin, end, group, head_dim, block_size, kv_head_stride, scale, acc,
           max_out, sum_out);
}

template <typename T, typename C>
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
  const C* kp = k_cache.data_ptr<C>();
  const C* vp = v_cache.data_ptr<C>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int64_t row_elems = k_cache.size(3);
  float* accp = acc.data_ptr<float>();
  float* maxp = maxes.data_ptr<float>();
  float* sump = sums.data_ptr<float>();
  // the matrix unit for bf16 rows of 64 or 128 dimensions where the CPU has AMX
#if defined(LLM_SERVE_AMX)
  const bool amx = std::is_same_v<T, at::BFloat16> && (head_dim == 64 || head_dim == 128) && llm_serve::request_amx();
#endif
  llm_serve::parallel_chunks(0, num_splits * num_kv_heads, 1, [&](llm_serve::Chunks& chunks) {
#if defined(LLM_SERVE_AMX)
    const TileScope tiles(amx);
#endif
    int64_t lo, hi;
    const auto locate = [&](int64_t item, int64_t& seq, int64_t& h, int64_t& begin, int64_t& end) {
      const int64_t split = item / num_kv_heads;
      h = item % num_kv_heads;
      seq = std::upper_bound(first_split.begin(), first_split.end(), split) - first_split.begin() - 1;
      begin = (split - first_split[seq]) * kSplitKeys;
      end = std::min<int64_t>(lens[seq], begin + kSplitKeys);
    };
    while (chunks.next(lo, hi))
      for (int64_t item = lo; item < hi; ++item) {
        int64_t seq, h, begin, end;
        next_item_rows.finish();  // what this item's kernel did not request yet
        if (llm_serve::kPrefetchIntoL2 && item + 1 < num_splits * num_kv_heads) {  // (into L1 it would evict)
          locate(item + 1, seq, h, begin, end);
          queue_item_rows(kp, vp, tables + seq * max_blocks, begin, end, block_size, row_elems, h * kv_head_stride);
        }
        locate(item, seq, h, begin, end);
        const int64_t split = item / num_kv_heads;
        const int64_t slot = split * num_kv_heads + h;
        attend_cached(qp + (seq * num_heads + h * group) * head_dim, kp, vp, tables + seq * max_blocks, begin, end,
                      group, head_dim, block_size, h * kv_head_stride, static_cast<float>(scale),
                      accp + slot * group * head_dim, maxp + slot * group, sump + slot * group);
      }
    next_item_rows.clear();  // the item after this thread's last is another's, or none
  });
  // merge each sequence's splits in order (in one thread for a few sequences: a parallel region
  // costs more than their merge)
  T* op = out.data_ptr<T>();
  llm_serve::parallel_for(0, num_seqs * num_kv_heads, 16, [&](int64_t lo, int64_t hi) {
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
  const bool int8_cache = k_cache.scalar_type() == at::kChar;
  TORCH_CHECK(v_cache.scalar_type() == k_cache.scalar_type() && (int8_cache || k_cache.scalar_type() == q.scalar_type()),
              "caches in q's dtype, or both int8");
  TORCH_CHECK(q.size(2) <= kMaxHeadDim && k_cache.size(3) == llm_serve::cache_row(q.size(2), int8_cache),
              "unsupported head_dim, or cache rows not head_dim (head_dim + 4 for int8)");
  TORCH_CHECK(k_cache.size(2) <= 64, "block_size above 64");
  auto tables = block_tables.contiguous();
  auto lens = seq_lens.contiguous();
  auto out = at::empty_like(q);
  if (q.scalar_type() == at::kBFloat16) {
    if (int8_cache)
      decode_attention_impl<at::BFloat16, int8_t>(q, k_cache, v_cache, tables, lens, scale, out);
    else
      decode_attention_impl<at::BFloat16, at::BFloat16>(q, k_cache, v_cache, tables, lens, scale, out);
  } else if (q.scalar_type() == at::kFloat) {
    if (int8_cache)
      decode_attention_impl<float, int8_t>(q, k_cache, v_cache, tables, lens, scale, out);
    else
      decode_attention_impl<float, float>(q, k_cache, v_cache, tables, lens, scale, out);
  } else {
    TORCH_CHECK(false, "paged_decode_attention: float32 or bfloat16");
  }
  return out;
}
