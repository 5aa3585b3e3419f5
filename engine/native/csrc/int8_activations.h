// Activations as int8 per row and group of `Group` inputs (32 or 64), x[m, k] ~ dx[m, g] * qx[m, k]
// with dx = amax / 127: what the VPDPBUSD kernels multiply (q4_int8_linear.cpp in groups of 32,
// those of its Q4_1 weights; int8_linear.cpp in groups of 64, see there).
#pragma once

#include "aten.h"

#include "parallel.h"
#include "vec16.h"

#include <algorithm>
#include <cstdint>
#include <memory>

// The int8 dot products the kernels are built on: VPDPBUSD (AVX512-VNNI), or AVX2's VPMADDUBSW +
// VPMADDWD on sign-adjusted operands (llama.cpp's AVX2 dot product); the scalar tier has neither.
#if defined(__AVX512VNNI__) || (defined(LLM_SERVE_VEC16) && !defined(__AVX512F__))
#define LLM_SERVE_INT8_DOT 1
#endif

namespace llm_serve {

constexpr int64_t kActivationGroup = 32;  // the group that check_int8_input asks of every kernel's inputs

// A buffer that keeps its memory between calls and only grows, uninitialized: a std::vector
// resized for every call allocated and zero-filled what the quantization then overwrote (at 512
// rows of 1,536 inputs, 786 KB of memset per call: 4 % of a prefill step's time)
template <typename T>
class GrowBuffer {
 public:
  void resize(int64_t n) {
    if (n > capacity_) {
      data_.reset(new T[n]);
      capacity_ = n;
    }
  }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  T& operator[](int64_t i) { return data_[i]; }
  const T& operator[](int64_t i) const { return data_[i]; }

 private:
  std::unique_ptr<T[]> data_;
  int64_t capacity_ = 0;
};

// One per thread (thread_local in with_own_activations), reused by every call
struct Activations {
  GrowBuffer<int8_t> q;         // [M, K]
  GrowBuffer<float> scale;      // [M, G] dx
  GrowBuffer<int32_t> offset;   // [M, G] -128 * sum of the group's q
};

#if defined(__AVX512VNNI__)
// groups first..first+n of x (n <= 16; the rows' groups of Group inputs one after another): each
// group's codes, scale and offset. Sixteen groups' maxima and sums come out of one transposing
// reduction each rather than a horizontal reduction per group, the same values (max and integer
// sums are exact in any order; the divisions are the scalar ones, lane by lane).
template <int Group, typename In>
inline void quantize_groups(const In* x, int64_t first, int n, Activations& a) {
  static_assert(Group % 16 == 0, "groups of whole vectors");
  constexpr int kVectors = Group / 16;
  __m512 parts[16];
  for (int j = 0; j < 16; ++j) {
    if (j < n) {
      const In* xg = x + (first + j) * Group;
      __m512 m = _mm512_abs_ps(load16(xg));
      for (int v = 1; v < kVectors; ++v) m = _mm512_max_ps(m, _mm512_abs_ps(load16(xg + 16 * v)));
      parts[j] = m;
    } else {
      parts[j] = _mm512_setzero_ps();
    }
  }
  const __m512 amax = reduce_lanes16(parts, [](__m512 p, __m512 q) { return _mm512_max_ps(p, q); });
  const __mmask16 positive = _mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_GT_OQ);
  const __m512 inv = _mm512_maskz_div_ps(positive, _mm512_set1_ps(127.f), amax);  // 0 where amax is 0
  const __mmask16 valid = static_cast<__mmask16>((1u << n) - 1);
  _mm512_mask_storeu_ps(a.scale.data() + first, valid, _mm512_div_ps(amax, _mm512_set1_ps(127.f)));
  __m512 sums[16];
  for (int j = 0; j < 16; ++j) {
    if (j < n) {
      const int64_t i = first + j;
      const In* xg = x + i * Group;
      const __m512 scale = _mm512_permutexvar_ps(_mm512_set1_epi32(j), inv);
      __m512i sum = _mm512_setzero_si512();
      for (int v = 0; v < kVectors; ++v) {
        const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(load16(xg + 16 * v), scale));  // nearest, ties to even
        _mm_storeu_si128(reinterpret_cast<__m128i*>(a.q.data() + i * Group + 16 * v), _mm512_cvtsepi32_epi8(q));
        sum = _mm512_add_epi32(sum, q);
      }
      sums[j] = _mm512_castsi512_ps(sum);
    } else {
      sums[j] = _mm512_setzero_ps();
    }
  }
  const __m512i total = _mm512_castps_si512(reduce_lanes16(sums, [](__m512 p, __m512 q) {
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), _mm512_castps_si512(q)));
  }));
  _mm512_mask_storeu_epi32(a.offset.data() + first, valid, _mm512_mullo_epi32(total, _mm512_set1_epi32(-128)));
}
#elif defined(LLM_SERVE_INT8_DOT)
// The same codes, scales and offsets group by group in AVX2 (the maxima and integer sums exact in
// any order; the divisions the scalar ones).
template <int Group, typename In>
inline void quantize_groups(const In* x, int64_t first, int n, Activations& a) {
  static_assert(Group % 16 == 0, "groups of whole vectors");
  const __m256 sign = _mm256_set1_ps(-0.f);
  for (int j = 0; j < n; ++j) {
    const int64_t i = first + j;
    const In* xg = x + i * Group;
    __m256 m = _mm256_setzero_ps();
    for (int v = 0; v < Group / 16; ++v) {
      const f32x16 xv = load16(xg + 16 * v);
      m = _mm256_max_ps(m, _mm256_max_ps(_mm256_andnot_ps(sign, xv.lo), _mm256_andnot_ps(sign, xv.hi)));
    }
    const float amax = reduce_max(f32x16{m, m});
    const __m256 inv = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    a.scale[i] = amax / 127.f;
    __m256i sum = _mm256_setzero_si256();
    for (int v = 0; v < Group / 16; ++v) {
      const f32x16 xv = load16(xg + 16 * v);
      const __m256i lo = _mm256_cvtps_epi32(_mm256_mul_ps(xv.lo, inv)), hi = _mm256_cvtps_epi32(_mm256_mul_ps(xv.hi, inv));
      // int32 -> int16 within 128-bit lanes, put in order, then -> int8 (saturating; |q| <= 127 already)
      const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(a.q.data() + i * Group + 16 * v),
                       _mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1)));
      sum = _mm256_add_epi32(sum, _mm256_add_epi32(lo, hi));
    }
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), sum);
    int32_t total = 0;
    for (int l = 0; l < 8; ++l) total += lanes[l];
    a.offset[i] = -128 * total;
  }
}
#endif

#if defined(LLM_SERVE_INT8_DOT)

// Sizes a's buffers for x [M, K]; returns the number of groups, quantized 16 at a time by
// quantize_blocks
template <int Group>
inline int64_t size_for(Activations& a, int64_t M, int64_t K) {
  const int64_t G = K / Group;
  a.q.resize(M * K);
  a.scale.resize(M * G);
  a.offset.resize(M * G);
  return M * G;
}

// Blocks lo..hi-1 of 16 groups (the last may be shorter) of x's `groups`
template <int Group, typename In>
inline void quantize_blocks(const In* x, int64_t groups, int64_t lo, int64_t hi, Activations& a) {
  for (int64_t b = lo; b < hi; ++b)
    quantize_groups<Group>(x, b * 16, static_cast<int>(std::min<int64_t>(16, groups - b * 16)), a);
}

// All M rows' groups, on the calling thread alone
template <int Group, typename In>
void quantize_rows(const In* x, int64_t M, int64_t K, Activations& a) {
  const int64_t groups = size_for<Group>(a, M, K);
  quantize_blocks<Group>(x, groups, 0, (groups + 15) / 16, a);
}

// All M rows' groups, shared out among the threads
template <int Group, typename In>
void quantize_rows_in_parallel(const In* x, int64_t M, int64_t K, Activations& a) {
  const int64_t groups = size_for<Group>(a, M, K);
  llm_serve::parallel_for(0, (groups + 15) / 16, 4,
                          [&](int64_t lo, int64_t hi) { quantize_blocks<Group>(x, groups, lo, hi, a); });
}

// Up to this many threads, each quantizes every row for itself (below); above, its copy would
// cost more than the tiles it shares the rows with (a thread's tiles are 1 / threads of the work)
constexpr int kMaxThreadsQuantizingAll = 4;

// fn(a, lo, hi) over the chunks [lo, hi) of [0, items) that parallel_chunks hands each thread,
// with `a` the quantization of all of x [M, K] in groups of Group inputs.
//
// Each thread quantizes every row for itself, before its first chunk, rather than its part for
// all: the threads' tiles read every row, so codes one thread wrote were shared with the other's
// cache, and each next call's stores had to take the lines back from it first. On the AMD EPYC
// (Zen 4, a VM's two vCPUs) those stores stalled: 72 % of the quantization's samples at one store,
// the quantization 7 % of a decode step at 32 rows. Twice the quantizing (O(M K), against the
// tiles' O(M K N)) costs less, and the kernel is one parallel region instead of two. With more
// threads than kMaxThreadsQuantizingAll (not measured here: the machines have two cores), the
// rows are quantized once, shared out, into the caller's buffer.
template <int Group, typename In, typename F>
void with_own_activations(const In* x, int64_t M, int64_t K, int64_t items, int64_t grain, const F& fn) {
  if (at::get_num_threads() > kMaxThreadsQuantizingAll) {
    thread_local Activations shared;
    Activations& a = shared;  // (the lambda below, run by other threads, must see this thread's)
    quantize_rows_in_parallel<Group>(x, M, K, a);
    llm_serve::parallel_for(0, items, grain,
                            [&](int64_t lo, int64_t hi) { fn(static_cast<const Activations&>(a), lo, hi); });
    return;
  }
  llm_serve::parallel_chunks(0, items, grain, [&](Chunks& chunks) {
    thread_local Activations own;
    int64_t lo, hi;
    bool quantized = false;
    while (chunks.next(lo, hi)) {
      if (!quantized) {
        quantize_rows<Group>(x, M, K, own);
        quantized = true;
      }
      fn(static_cast<const Activations&>(own), lo, hi);
    }
  });
}
#endif

// The checks every int8 kernel makes of its input: x [rows, in_features], float32 or bfloat16,
// in_features a multiple of 32.
inline void check_int8_input(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "x: float32 or bfloat16 [rows, in_features]");
  TORCH_CHECK(x.size(1) % kActivationGroup == 0, "in_features must be a multiple of 32");
}

// out [rows, n] for x, float32 if float32_out (or x is float32), else x's dtype, filled by
// run(x's data, out's data) with the two element types
template <typename Run>
at::Tensor run_int8_kernel(const at::Tensor& x, int64_t n, bool float32_out, Run run) {
  const auto out_dtype = float32_out ? at::kFloat : x.scalar_type();
  at::Tensor out = at::empty({x.size(0), n}, x.options().dtype(out_dtype));
  const at::Tensor xc = x.contiguous();
  if (x.scalar_type() == at::kFloat) {
    run(xc.data_ptr<float>(), out.data_ptr<float>());  // float32 out either way
  } else if (float32_out) {
    run(xc.data_ptr<at::BFloat16>(), out.data_ptr<float>());
  } else {
    run(xc.data_ptr<at::BFloat16>(), out.data_ptr<at::BFloat16>());
  }
  return out;
}

}  // namespace llm_serve
