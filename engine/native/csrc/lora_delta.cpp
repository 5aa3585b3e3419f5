// The LoRA delta of one projection on the CPU, punica's shrink then expand, added to the base
// output in place, for a step whose rows run different adapters:
//
//     t[i][r] = sum_k x[i][k] * a[s][r][k]                      (float32, not rounded)
//     out[i]  = dtype(float(out[i]) + sum_r t[i][r] * bt[s][r])  for each row i of slot s = slots[i] >= 0
//
// rows of slot -1 (the base model) are left as they are. Shapes: x [rows, in] and out [rows, n],
// contiguous rows, in one dtype (float32 or bfloat16) with a [slots, width, in] (the A matrices,
// the slices stacked along the rank) and bt [slots, width, n] (B transposed, scaling folded in:
// the expand adds whole rows of it); slots [rows] int32; slices: where B^T is block-diagonal (a
// merged projection), each block's rank rows and output columns, so the zeros are skipped.
//
// The rows are taken in blocks of up to kBlockRows rows of one slot, so a block reads the slot's A
// and B once. Each row keeps its own sums, added in the same order whatever block or tile it is in:
// a row's delta does not depend on the rest of the batch.
#include "aten.h"

#include "kernels.h"
#include "lora_delta.h"
#include "parallel.h"
#include "vec16.h"
#include "with_rows.h"

#include <algorithm>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

// Rows per block, and the register tiles: the shrink's sums of kShrinkRows rows x kShrinkRanks rank
// columns, the expand's of kBlockRows rows x kExpandVecs vectors of 16 output columns (AVX2's f32x16
// takes two of its 16 registers, AVX-512's one of 32). Each tile loads each operand vector once
// for several FMAs: one load per FMA would bound the loop by the loads.
#if defined(__AVX512F__)
constexpr int kBlockRows = 8, kShrinkRows = 4, kShrinkRanks = 4, kExpandVecs = 2;
#else
constexpr int kBlockRows = 4, kShrinkRows = 2, kShrinkRanks = 2, kExpandVecs = 1;
#endif
static_assert(kBlockRows <= kLoraBlockRowsMax);
#if defined(__AVX512BF16__)
constexpr bool kBf16Pairs = true;  // bfloat16 through VDPBF16PS pairs (below)
#else
constexpr bool kBf16Pairs = false;
#endif

// An expand slice: B^T's rank rows [r0, r1) feed output columns [c0, c1) (a merged projection's
// q, k, v or gate, up); the rest of B^T is zeros.
struct Slice {
  int64_t r0, r1, c0, c1;
};

// t[j][q] = x[j] . a[q] for a tile of rows x rank columns (pointers repeat the last valid row or
// column where the tile overhangs; the caller keeps only the valid sums).
template <typename T, int M, int Q>
void shrink_tile(const float* const* x, const T* const* a, int64_t in, float t[M][Q]) {
  int64_t k = 0;
#if defined(LLM_SERVE_VEC16)
  llm_serve::f32x16 acc[M][Q];
  for (int j = 0; j < M; ++j)
    for (int q = 0; q < Q; ++q) acc[j][q] = llm_serve::zero16();
  for (; k + 16 <= in; k += 16) {
    llm_serve::f32x16 av[Q];
    for (int q = 0; q < Q; ++q) av[q] = llm_serve::load16(a[q] + k);
    for (int j = 0; j < M; ++j) {
      const llm_serve::f32x16 xv = llm_serve::load16(x[j] + k);
      for (int q = 0; q < Q; ++q) acc[j][q] = llm_serve::fmadd(xv, av[q], acc[j][q]);
    }
  }
  for (int j = 0; j < M; ++j)
    for (int q = 0; q < Q; ++q) t[j][q] = llm_serve::reduce_add(acc[j][q]);
#else
  for (int j = 0; j < M; ++j)
    for (int q = 0; q < Q; ++q) t[j][q] = 0.f;
#endif
  for (; k < in; ++k)
    for (int j = 0; j < M; ++j)
      for (int q = 0; q < Q; ++q) t[j][q] += x[j][k] * static_cast<float>(a[q][k]);
}

#if defined(LLM_SERVE_VEC16)
// expand_rows's sums over whole chunks of 16 * V columns from c; returns where they end
template <typename T, int M, int V>
int64_t expand_vectors(const float* t, int64_t t_stride, int64_t ranks, const T* bt, int64_t bt_stride, int64_t c,
                       int64_t c_end, T* const* out) {
  for (; c + 16 * V <= c_end; c += 16 * V) {
    llm_serve::f32x16 acc[M][V];
    for (int j = 0; j < M; ++j)
      for (int e = 0; e < V; ++e) acc[j][e] = llm_serve::zero16();
    for (int64_t r = 0; r < ranks; ++r) {
      llm_serve::f32x16 bv[V];
      for (int e = 0; e < V; ++e) bv[e] = llm_serve::load16(bt + r * bt_stride + c + 16 * e);
      for (int j = 0; j < M; ++j) {
        const llm_serve::f32x16 tj = llm_serve::set16(t[j * t_stride + r]);
        for (int e = 0; e < V; ++e) acc[j][e] = llm_serve::fmadd(tj, bv[e], acc[j][e]);
      }
    }
    for (int j = 0; j < M; ++j)
      for (int e = 0; e < V; ++e) {
        T* o = out[j] + c + 16 * e;
        llm_serve::store16(o, llm_serve::add(llm_serve::load16(o), acc[j][e]));
      }
  }
  return c;
}
#endif

// out[j][c] += t[j] . B^T[:, c] over `ranks` rank columns, for M rows and the columns c_begin <= c
// < c_end: t's rows t_stride apart (float32), B^T's rows bt_stride apart
template <typename T, int M>
void expand_rows(const float* t, int64_t t_stride, int64_t ranks, const T* bt, int64_t bt_stride, int64_t c_begin,
                 int64_t c_end, T* const* out) {
  int64_t c = c_begin;
#if defined(LLM_SERVE_VEC16)
  c = expand_vectors<T, M, kExpandVecs>(t, t_stride, ranks, bt, bt_stride, c, c_end, out);
  c = expand_vectors<T, M, 1>(t, t_stride, ranks, bt, bt_stride, c, c_end, out);  // the same sums, a vector at a time
#endif
  for (; c < c_end; ++c)
    for (int j = 0; j < M; ++j) {
      float sum = 0.f;
      for (int64_t r = 0; r < ranks; ++r) sum += t[j * t_stride + r] * static_cast<float>(bt[r * bt_stride + c]);
      out[j][c] = static_cast<T>(static_cast<float>(out[j][c]) + sum);
    }
}

#if defined(__AVX512BF16__)
// bfloat16 on a CPU with AVX512-BF16: VDPBF16PS multiplies bfloat16 pairs exactly and adds both
// products to a float32 lane, twice the products of an FMA per instruction and no conversions.
// The shrink pairs neighbouring inputs (k, k + 1) of a row of x and of A as they lie; the expand
// pairs rank columns (r, r + 1): t rounded to bfloat16 (as a bfloat16 matmul rounds it) and the two
// rows of B^T interleaved by VPUNPCK{L,H}WD, which leaves the output columns of a 32-column chunk
// in the order [0-3, 8-11, 16-19, 24-27 | 4-7, 12-15, 20-23, 28-31], put back before the add.
using Bf16 = at::BFloat16;

template <int M, int Q>
void shrink_tile_bf16(const Bf16* const* x, const Bf16* const* a, int64_t in, float t[M][Q]) {
  __m512 acc[M][Q];
  for (int j = 0; j < M; ++j)
    for (int q = 0; q < Q; ++q) acc[j][q] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= in; k += 32) {
    __m512bh av[Q];
    for (int q = 0; q < Q; ++q) av[q] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(a[q] + k));
    for (int j = 0; j < M; ++j) {
      const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(x[j] + k));
      for (int q = 0; q < Q; ++q) acc[j][q] = _mm512_dpbf16_ps(acc[j][q], xv, av[q]);
    }
  }
  for (int j = 0; j < M; ++j)
    for (int q = 0; q < Q; ++q) t[j][q] = _mm512_reduce_add_ps(acc[j][q]);
  for (; k < in; ++k)
    for (int j = 0; j < M; ++j)
      for (int q = 0; q < Q; ++q) t[j][q] += static_cast<float>(x[j][k]) * static_cast<float>(a[q][k]);
}

inline uint32_t bf16_pair(float lo, float hi) {
  return static_cast<uint32_t>(Bf16(lo).x) | (static_cast<uint32_t>(Bf16(hi).x) << 16);
}

// expand_rows's sum in pairs over whole chunks of 32 columns from c_begin; returns where they end
template <int M>
int64_t expand_rows_bf16(const float* t, int64_t t_stride, int64_t ranks, const Bf16* bt, int64_t bt_stride,
                         int64_t c_begin, int64_t c_end, Bf16* const* out) {
  const int64_t pairs = (ranks + 1) / 2;
  uint32_t tp[M][64];
  TORCH_CHECK(pairs <= 64, "LoRA rank over 128");
  for (int j = 0; j < M; ++j)
    for (int64_t p = 0; p < pairs; ++p)
      tp[j][p] = bf16_pair(t[j * t_stride + 2 * p], 2 * p + 1 < ranks ? t[j * t_stride + 2 * p + 1] : 0.f);
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  int64_t c = c_begin;
  for (; c + 32 <= c_end; c += 32) {
    __m512 lo_acc[M], hi_acc[M];
    for (int j = 0; j < M; ++j) lo_acc[j] = hi_acc[j] = _mm512_setzero_ps();
    for (int64_t p = 0; p < pairs; ++p) {
      const __m512i b0 = _mm512_loadu_si512(bt + 2 * p * bt_stride + c);
      const __m512i b1 = _mm512_loadu_si512(bt + std::min<int64_t>(2 * p + 1, ranks - 1) * bt_stride + c);  // t 0 past
      const __m512bh lo = reinterpret_cast<__m512bh>(_mm512_unpacklo_epi16(b0, b1));
      const __m512bh hi = reinterpret_cast<__m512bh>(_mm512_unpackhi_epi16(b0, b1));
      for (int j = 0; j < M; ++j) {
        const __m512bh tv = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(tp[j][p])));
        lo_acc[j] = _mm512_dpbf16_ps(lo_acc[j], tv, lo);
        hi_acc[j] = _mm512_dpbf16_ps(hi_acc[j], tv, hi);
      }
    }
    for (int j = 0; j < M; ++j) {
      Bf16* o = out[j] + c;
      llm_serve::store16(o, _mm512_add_ps(llm_serve::load16(o), _mm512_permutex2var_ps(lo_acc[j], first, hi_acc[j])));
      llm_serve::store16(o + 16,
                         _mm512_add_ps(llm_serve::load16(o + 16), _mm512_permutex2var_ps(lo_acc[j], second, hi_acc[j])));
    }
  }
  return c;
}

#endif

template <typename T>
void add_block_delta(const LoraRowBlock& block, const T* x, T* out, const T* a, const T* bt, int64_t in, int64_t n,
                     int64_t width, const std::vector<Slice>& slices, std::vector<float>& xs, std::vector<float>& t) {
  constexpr bool pairs = kBf16Pairs && std::is_same_v<T, at::BFloat16>;  // the shrink reads x as it is
  const int m = block.count;
  t.resize(m * width);
  if constexpr (!pairs) {
    xs.resize(m * in);
    for (int j = 0; j < m; ++j)
      for (int64_t k = 0; k < in; ++k) xs[j * in + k] = static_cast<float>(x[block.rows[j] * in + k]);
  }
  const T* a_slot = a + block.slot * width * in;
  // shrink: t = x A^T, in tiles of rows x rank columns
  for (int j0 = 0; j0 < m; j0 += kShrinkRows) {
    for (int64_t r0 = 0; r0 < width; r0 += kShrinkRanks) {
      const T* a_rows[kShrinkRanks];
      for (int q = 0; q < kShrinkRanks; ++q) a_rows[q] = a_slot + std::min<int64_t>(r0 + q, width - 1) * in;
      float tile[kShrinkRows][kShrinkRanks];
#if defined(__AVX512BF16__)
      if constexpr (pairs) {
        const T* x_rows[kShrinkRows];
        for (int j = 0; j < kShrinkRows; ++j) x_rows[j] = x + block.rows[std::min(j0 + j, m - 1)] * in;
        shrink_tile_bf16<kShrinkRows, kShrinkRanks>(x_rows, a_rows, in, tile);
      }
#endif
      if constexpr (!pairs) {
        const float* x_rows[kShrinkRows];
        for (int j = 0; j < kShrinkRows; ++j) x_rows[j] = &xs[std::min(j0 + j, m - 1) * in];
        shrink_tile<T, kShrinkRows, kShrinkRanks>(x_rows, a_rows, in, tile);
      }
      for (int j = 0; j < kShrinkRows && j0 + j < m; ++j)
        for (int q = 0; q < kShrinkRanks && r0 + q < width; ++q) t[(j0 + j) * width + r0 + q] = tile[j][q];
    }
  }
  // expand: out += t B^T, each slice's rank columns into its output columns (B^T's other blocks
  // are zeros, never read)
  T* out_rows[kBlockRows];
  for (int j = 0; j < m; ++j) out_rows[j] = out + block.rows[j] * n;
  const T* bt_slot = bt + block.slot * width * n;
  for (const Slice& s : slices) {
    const float* ts = t.data() + s.r0;
    const T* bts = bt_slot + s.r0 * n;
    const int64_t ranks = s.r1 - s.r0;
    llm_serve::with_rows<kBlockRows>(m, [&](auto rows) {
      int64_t c = s.c0;  // the columns before c done in pairs
#if defined(__AVX512BF16__)
      if constexpr (pairs) c = expand_rows_bf16<decltype(rows)::value>(ts, width, ranks, bts, n, c, s.c1, out_rows);
#endif
      expand_rows<T, decltype(rows)::value>(ts, width, ranks, bts, n, c, s.c1, out_rows);
    });
  }
}

template <typename T>
void add_delta(const at::Tensor& x, at::Tensor& out, const at::Tensor& a, const at::Tensor& bt,
               const LoraRows& blocks, const std::vector<Slice>& slices) {
  const int64_t in = x.size(1), n = out.size(1), width = a.size(1);
  const T* xp = x.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const T* ap = a.data_ptr<T>();
  const T* bp = bt.data_ptr<T>();
  llm_serve::parallel_for(0, static_cast<int64_t>(blocks.size()), 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> xs, t;
    for (int64_t b = lo; b < hi; ++b) add_block_delta<T>(blocks[b], xp, op, ap, bp, in, n, width, slices, xs, t);
  });
}

}  // namespace

LoraRows lora_rows(const at::Tensor& slots, int64_t num_slots) {
  TORCH_CHECK(slots.dim() == 1 && slots.scalar_type() == at::kInt && slots.is_contiguous(), "slots: [rows] int32");
  const int32_t* sp = slots.data_ptr<int32_t>();
  std::vector<int64_t> order;
  for (int64_t i = 0; i < slots.size(0); ++i) {
    TORCH_CHECK(sp[i] >= -1 && sp[i] < num_slots, "slot ", sp[i], " of row ", i, " outside -1..", num_slots - 1);
    if (sp[i] >= 0) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return sp[a] < sp[b]; });
  LoraRows blocks;
  for (int64_t i : order) {
    if (blocks.empty() || blocks.back().slot != sp[i] || blocks.back().count == kBlockRows)
      blocks.push_back({sp[i], {}, 0});
    blocks.back().rows[blocks.back().count++] = i;
  }
  return blocks;
}

void lora_add_delta_rows(const at::Tensor& x, at::Tensor out, const at::Tensor& a, const at::Tensor& bt,
                         const LoraRows& rows, const std::vector<int64_t>& slices) {
  TORCH_CHECK(x.dim() == 2 && out.dim() == 2 && x.size(0) == out.size(0), "x [rows, in], out [rows, n]");
  TORCH_CHECK(x.is_contiguous() && out.is_contiguous() && a.is_contiguous() && bt.is_contiguous(),
              "x, out, a and bt contiguous");
  TORCH_CHECK(a.dim() == 3 && a.size(2) == x.size(1), "a: [slots, width, in]");
  TORCH_CHECK(bt.dim() == 3 && bt.size(0) == a.size(0) && bt.size(1) == a.size(1) && bt.size(2) == out.size(1),
              "bt: [slots, width, n]");
  TORCH_CHECK(x.scalar_type() == out.scalar_type() && a.scalar_type() == x.scalar_type() &&
                  bt.scalar_type() == x.scalar_type(),
              "x, out, a and bt in one dtype");
  TORCH_CHECK(slices.size() % 4 == 0, "slices: (rank begin, rank end, column begin, column end) each");
  std::vector<Slice> parts;
  for (size_t i = 0; i < slices.size(); i += 4) {
    parts.push_back({slices[i], slices[i + 1], slices[i + 2], slices[i + 3]});
    const Slice& s = parts.back();
    TORCH_CHECK(0 <= s.r0 && s.r0 < s.r1 && s.r1 <= a.size(1) && 0 <= s.c0 && s.c0 < s.c1 && s.c1 <= out.size(1),
                "slice ", i / 4, " outside B^T [", a.size(1), ", ", out.size(1), "]");
  }
  if (parts.empty()) parts.push_back({0, a.size(1), 0, out.size(1)});  // no slices: B^T whole
  if (x.scalar_type() == at::kBFloat16)
    add_delta<at::BFloat16>(x, out, a, bt, rows, parts);
  else if (x.scalar_type() == at::kFloat)
    add_delta<float>(x, out, a, bt, rows, parts);
  else
    TORCH_CHECK(false, "lora_add_delta: float32 or bfloat16");
}

void lora_add_delta(const at::Tensor& x, at::Tensor out, const at::Tensor& a, const at::Tensor& bt,
                    const at::Tensor& slots, const std::vector<int64_t>& slices) {
  TORCH_CHECK(slots.size(0) == x.size(0), "slots: one per row of x");
  lora_add_delta_rows(x, out, a, bt, lora_rows(slots, a.size(0)), slices);
}
