// Linear layers for batches: int8 activations x int8 weights through AVX512-VNNI (VPDPBUSD, 64
// multiply-adds per instruction, twice bfloat16's VDPBF16PS), for the row counts where a step is
// bound by arithmetic rather than by the bytes of the weights.
//
//   weights: per output channel, w[n, k] ~ sw[n] * qw[n, k], qw in -127..127, stored as
//            qw + 128 (VPDPBUSD multiplies unsigned by signed bytes) in "quads" of 16 outputs x 4
//            inputs: uint8 [N/16, K/4, 16, 4] (engine/models/int8_linear.py packs them)
//   activations: per row and group of 64 inputs, x[m, k] ~ dx[m, g] * qx[m, k], dx = amax / 127,
//            quantized here for each call. A group's scale follows its own outliers, which one
//            scale per row would not (that costs this model about 3 % of perplexity). Groups of
//            64 rather than llama.cpp's 32: each group ends in a conversion and an FMA per
//            accumulator (24 per 96 VPDPBUSD at 32 inputs in a 4 x 3 tile, 24 per 192 at 64); at 64
//            a prefill of 32 x 158 tokens took 0.93x the time and a decode step at 32 sequences
//            0.98x (AMD EPYC, Zen 4), for 0.1-0.3 % of perplexity (the batch path's 18.8236 ->
//            18.8514 on the shipped text, +1.20 % of the float32 model's; the README's table).
//
//   out[m, n] = sw[n] * sum_g dx[m, g] * (sum_{k in g} (qw[n, k] + 128) * qx[m, k] - 128 * sum_{k in g} qx[m, k])
//
// int8_linear_silu_mul runs the MLP's [gate | up] projection with its silu_and_mul in the same
// pass (each tile two gate vectors and the two up vectors of the same outputs), bitwise the two
// kernels: a prefill of 32 x 128 tokens about 0.98x the time.
//
// The group's integer dot starts from -128 * sum qx (its offset, per row and group: no per-output
// term), is exact in int32, and meets dx in one float32 FMA per group; the sums over groups run
// in order, so a row's result does not depend on the batch it is in.
#include "aten.h"

#include "int8_activations.h"
#include "parallel.h"
#include "prefetch.h"
#include "vec16.h"
#include "with_rows.h"

#include <cstdint>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kGroup = 64;  // inputs per activation scale
constexpr int64_t kVector = 16;  // outputs per weight vector
constexpr int64_t kQuad = 4;     // inputs per VPDPBUSD lane
#if defined(__AVX512VNNI__)
constexpr int kTileVectors = 3;  // weight vectors per tile (48 outputs)
constexpr int kTileRows = 4;     // rows per tile: 4 x 3 int32 accumulators in registers
                                 // (4 x 4 ran the same; 5 x 4, 6 x 4 and 8 x 3 slower)
constexpr int kSiluRows = 4;     // the fused silu's tiles: rows, and gate/up vector pairs
constexpr int kSiluPairs = 2;    // (4 x 4 dots; 6 x 2 and 8 x 2: 5-8 % slower)
#else
// AVX2: a vector's 16 int32 sums take two of the 16 registers
constexpr int kTileVectors = 1;
constexpr int kTileRows = 4;
constexpr int kSiluRows = 2;
constexpr int kSiluPairs = 1;
#endif

#if defined(LLM_SERVE_INT8_DOT)
using llm_serve::Activations;

// bytes of one weight vector (16 outputs x K inputs)
inline int64_t vector_bytes(int64_t K) { return K * kVector; }

// Lines of the next tile's weights: `lines` of 64 bytes from start[0] and, where it is not null,
// as many from start[1] (the fused silu's tile reads two runs, its gate and its up vectors)
struct NextWeights {
  const uint8_t* start[2];
  int64_t lines;
};

// The share of them that one row tile requests: lines first .. first + count. Passed to the tile
// as a reference and two integers: a struct of them built for each call (by value) was stored
// and then read back wider than written, a failed store forwarding per row tile (3-4 % of a
// prefill).
struct Ahead {
  const NextWeights& next;
  int64_t first, count;
};

#if defined(__AVX512VNNI__)
// Rows r0..r0+R of the V weight vectors at wv[0..V) (16 outputs each), requesting `ahead`'s lines
// spread over the groups; finish(r0, acc) takes the sums, float32 acc[R][V][16] before the
// weights' scales.
template <int R, int V, typename Finish>
inline void tile(const Activations& a, const uint8_t* const (&wv)[V], int64_t K, int64_t r0, const Ahead& ahead,
                 const Finish& finish) {
  const int64_t G = K / kGroup;
  // The float32 sums live in memory (L1), touched once per group: held in registers beside the
  // 4 x 3 dots they left GCC too few for the weight vectors, which it then loaded again for every
  // row (15 loads per 12 VPDPBUSD instead of 7: the tile bound by loads, not by VPDPBUSD). A
  // 512-row gate_up on one Zen 5 core: 814-833 -> 908-936 GOP/s, the same sums bitwise.
  alignas(64) float acc[R][V][kVector] = {};
  const int8_t* xr = a.q.data() + r0 * K;
  const int64_t per_group = (ahead.count + G - 1) / G;
  const uint8_t* const first0 = ahead.next.start[0] + ahead.first * 64;
  const uint8_t* const first1 = ahead.next.start[1] == nullptr ? nullptr : ahead.next.start[1] + ahead.first * 64;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t l = g * per_group; l < std::min(ahead.count, (g + 1) * per_group); ++l) {
      llm_serve::prefetch_line(first0 + l * 64);
      if (first1 != nullptr) llm_serve::prefetch_line(first1 + l * 64);
    }
    __m512i dot[R][V];
    for (int r = 0; r < R; ++r) {
      const __m512i start = _mm512_set1_epi32(a.offset[(r0 + r) * G + g]);
      for (int v = 0; v < V; ++v) dot[r][v] = start;
    }
    // unrolled: GCC 12 otherwise copies the 4 x 3 dot registers around its loop (about 24 moves and
    // reloads per 12 VPDPBUSD), which held the tile to 630 GOP/s of the 1,100 one Zen 5 core issues
    // (unrolled: 920, the same sums bitwise)
#pragma GCC unroll 16
    for (int t = 0; t < kGroup / kQuad; ++t) {
      const int64_t quad = g * (kGroup / kQuad) + t;  // kVector * kQuad bytes of each vector
      __m512i wq[V];
      for (int v = 0; v < V; ++v) wq[v] = _mm512_loadu_si512(wv[v] + quad * kVector * kQuad);
      for (int r = 0; r < R; ++r) {
        int32_t four;
        __builtin_memcpy(&four, xr + r * K + quad * kQuad, sizeof(four));
        const __m512i xq = _mm512_set1_epi32(four);
        for (int v = 0; v < V; ++v) dot[r][v] = _mm512_dpbusd_epi32(dot[r][v], wq[v], xq);
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m512 d = _mm512_set1_ps(a.scale[(r0 + r) * G + g]);
      for (int v = 0; v < V; ++v)
        _mm512_store_ps(acc[r][v], _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][v]), d, _mm512_load_ps(acc[r][v])));
    }
  }
  finish(r0, acc);
}
#endif

#if !defined(__AVX512VNNI__)
// The AVX2 tile, the VNNI one's arithmetic in AVX2: the weights made signed again (qw = code ^ 0x80)
// and each product's sign moved onto the weight (|qx| * sign(qx) qw), so VPMADDUBSW's unsigned x
// signed bytes take them: its pairs stay within int16 (2 x 127 x 127), VPMADDWD adds pairs into
// int32. The group's dots are the exact sum qw * qx, as VPDPBUSD's from -128 sum qx.
template <int R, int V, typename Finish>
inline void tile(const Activations& a, const uint8_t* const (&wv)[V], int64_t K, int64_t r0, const Ahead& ahead,
                 const Finish& finish) {
  const int64_t G = K / kGroup;
  alignas(64) float acc[R][V][kVector] = {};
  const int8_t* xr = a.q.data() + r0 * K;
  const int64_t per_group = (ahead.count + G - 1) / G;
  const uint8_t* const first0 = ahead.next.start[0] + ahead.first * 64;
  const uint8_t* const first1 = ahead.next.start[1] == nullptr ? nullptr : ahead.next.start[1] + ahead.first * 64;
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80)), ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t l = g * per_group; l < std::min(ahead.count, (g + 1) * per_group); ++l) {
      llm_serve::prefetch_line(first0 + l * 64);
      if (first1 != nullptr) llm_serve::prefetch_line(first1 + l * 64);
    }
    __m256i dot[R][V][2];  // outputs 0..7, 8..15 of each vector
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v) dot[r][v][0] = dot[r][v][1] = _mm256_setzero_si256();
#pragma GCC unroll 16
    for (int t = 0; t < kGroup / kQuad; ++t) {
      const int64_t quad = g * (kGroup / kQuad) + t;
      __m256i wq[V][2];
      for (int v = 0; v < V; ++v)
        for (int h = 0; h < 2; ++h)
          wq[v][h] = _mm256_xor_si256(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wv[v] + quad * kVector * kQuad + 32 * h)), flip);
      for (int r = 0; r < R; ++r) {
        int32_t four;
        __builtin_memcpy(&four, xr + r * K + quad * kQuad, sizeof(four));
        const __m256i xq = _mm256_set1_epi32(four), ax = _mm256_abs_epi8(xq);
        for (int v = 0; v < V; ++v)
          for (int h = 0; h < 2; ++h)
          {
            dot[r][v][h] = _mm256_add_epi32(
                dot[r][v][h], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(wq[v][h], xq)), ones));
            // (kept in its register: otherwise GCC regroups the integer sums over the unrolled
            // quads, holds the products at once and spills them to the stack)
            __asm__("" : "+x"(dot[r][v][h]));
          }
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m256 d = _mm256_set1_ps(a.scale[(r0 + r) * G + g]);
      for (int v = 0; v < V; ++v)
        for (int h = 0; h < 2; ++h)
          _mm256_store_ps(acc[r][v] + 8 * h,
                          _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][v][h]), d, _mm256_load_ps(acc[r][v] + 8 * h)));
    }
  }
  finish(r0, acc);
}
#endif

// Every row of the V weight vectors at wv, R rows per tile, requesting the next tile's weights a
// share at a time as the row tiles go. The first row tile reads this tile's weights from memory
// and the others from the caches; without the requests each tile's first row tile waited on
// memory (30 layers' gate_up at 32 rows: 6.6 ms with the weights cold in memory, 4.7 ms with one
// layer's in cache; a decode step at 32 sequences 0.91x the time with the requests, a prefill of
// 512-row steps the same).
template <int R, int V, typename Finish>
inline void rows_of_tile(const Activations& a, const uint8_t* const (&wv)[V], int64_t M, int64_t K,
                         NextWeights next, const Finish& finish) {
  const int64_t row_tiles = (M + R - 1) / R;
  // over the first half of the row tiles, so the last requests have half a tile's time to land
  const int64_t spread = std::max<int64_t>(1, row_tiles / 2);
  const int64_t per_tile = (next.lines + spread - 1) / spread;
  auto ahead = [&](int64_t r) {
    const int64_t first = std::min(next.lines, r / R * per_tile);
    return Ahead{next, first, std::min(per_tile, next.lines - first)};
  };
  int64_t r = 0;
  for (; r + R <= M; r += R) tile<R, V>(a, wv, K, r, ahead(r), finish);
  if constexpr (R > 1) {
    if (r < M) {
      llm_serve::with_rows<R - 1>(static_cast<int>(M - r),
                       [&](auto rows) { tile<decltype(rows)::value, V>(a, wv, K, r, ahead(r), finish); });
    }
  }
}

// The rows of outputs v0 * 16 .. (v0 + V) * 16: out = the sums times the weights' scales
template <int V, typename Out>
inline void linear_tile(const Activations& a, const uint8_t* w, const float* w_scale, int64_t M, int64_t K,
                        int64_t v0, Out* out, int64_t N, NextWeights next) {
  const uint8_t* wv[V];
  for (int v = 0; v < V; ++v) wv[v] = w + (v0 + v) * vector_bytes(K);
  rows_of_tile<kTileRows, V>(a, wv, M, K, next, [&](int64_t r0, const auto& acc) {
    constexpr int R = std::extent_v<std::remove_reference_t<decltype(acc)>>;
    for (int v = 0; v < V; ++v) {
      const llm_serve::f32x16 s = llm_serve::load16(w_scale + (v0 + v) * kVector);
      for (int r = 0; r < R; ++r)
        llm_serve::store16(out + (r0 + r) * N + (v0 + v) * kVector, llm_serve::mul(llm_serve::load16(acc[r][v]), s));
    }
  });
}

template <typename In, typename Out>
void run(const In* x, const uint8_t* w, const float* w_scale, int64_t M, int64_t K, int64_t N, Out* out) {
  const int64_t vectors = N / kVector, tiles = (vectors + kTileVectors - 1) / kTileVectors;
  // a thread takes whole tiles: each tile's weights (K x 48 bytes) stay in L1/L2 over the rows
  llm_serve::with_own_activations<kGroup>(x, M, K, tiles, 1, [&](const Activations& a, int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t v0 = t * kTileVectors;
      // the tile after this one: the next a thread takes from its own share
      const int64_t next_v0 = std::min(vectors, v0 + kTileVectors);
      const int64_t lines = (std::min(vectors, next_v0 + kTileVectors) - next_v0) * vector_bytes(K) / 64;
      const NextWeights next{{w + next_v0 * vector_bytes(K), nullptr}, lines};
      const int64_t count = std::min<int64_t>(kTileVectors, vectors - v0);  // the last tile may be narrower
      if (count == kTileVectors) linear_tile<kTileVectors>(a, w, w_scale, M, K, v0, out, N, next);
      else if (count == 2) linear_tile<2>(a, w, w_scale, M, K, v0, out, N, next);
      else linear_tile<1>(a, w, w_scale, M, K, v0, out, N, next);
    }
  });
}

// silu_and_mul of [gate | up] = the layer's outputs, in the tiles' pass: each tile takes P gate
// vectors and the P up vectors of the same outputs (`half` vectors on), rounds both sums as
// int8_linear rounds its outputs and stores silu(gate) * up as silu_and_mul computes it.

template <int P, typename Out>
inline void silu_tile(const Activations& a, const uint8_t* w, const float* w_scale, int64_t M, int64_t K,
                      int64_t v0, int64_t half, Out* out, NextWeights next) {
  const uint8_t* wv[2 * P];
  for (int p = 0; p < P; ++p) {
    wv[p] = w + (v0 + p) * vector_bytes(K);
    wv[P + p] = w + (half + v0 + p) * vector_bytes(K);
  }
  const int64_t width = half * kVector;
  rows_of_tile<kSiluRows, 2 * P>(a, wv, M, K, next, [&](int64_t r0, const auto& acc) {
    constexpr int R = std::extent_v<std::remove_reference_t<decltype(acc)>>;
    using namespace llm_serve;  // NOLINT: the vector functions (vec16.h)
    for (int p = 0; p < P; ++p) {
      const f32x16 gate_scale = load16(w_scale + (v0 + p) * kVector);
      const f32x16 up_scale = load16(w_scale + (half + v0 + p) * kVector);
      for (int r = 0; r < R; ++r) {
        const f32x16 gate = round_to<Out>(mul(load16(acc[r][p]), gate_scale));
        const f32x16 up = round_to<Out>(mul(load16(acc[r][P + p]), up_scale));
        llm_serve::store16(out + (r0 + r) * width + (v0 + p) * kVector, llm_serve::silu_mul16<Out>(gate, up));
      }
    }
  });
}

template <typename In, typename Out>
void run_silu(const In* x, const uint8_t* w, const float* w_scale, int64_t M, int64_t K, int64_t N, Out* out) {
  const int64_t half = N / kVector / 2, tiles = (half + kSiluPairs - 1) / kSiluPairs;
  llm_serve::with_own_activations<kGroup>(x, M, K, tiles, 1, [&](const Activations& a, int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t v0 = t * kSiluPairs, pairs = std::min<int64_t>(kSiluPairs, half - v0);
      // the next tile's gate and up vectors
      const int64_t next_v0 = std::min(half, v0 + kSiluPairs);
      const int64_t lines = (std::min(half, next_v0 + kSiluPairs) - next_v0) * vector_bytes(K) / 64;
      const NextWeights next{{w + next_v0 * vector_bytes(K), w + (half + next_v0) * vector_bytes(K)}, lines};
      if (pairs == kSiluPairs) silu_tile<kSiluPairs>(a, w, w_scale, M, K, v0, half, out, next);
      else silu_tile<1>(a, w, w_scale, M, K, v0, half, out, next);
    }
  });
}
#endif

}  // namespace

bool int8_linear_available() {
#if defined(LLM_SERVE_INT8_DOT)
  return true;
#else
  return false;
#endif
}

// x [M, K] float32 or bfloat16 (K a multiple of 64); weights uint8 [N/16, K/4, 16, 4] (qw + 128);
// w_scale float32 [N]. out [M, N]: float32 if float32_out, else x's dtype.
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& weights, const at::Tensor& w_scale, bool float32_out) {
  TORCH_CHECK(int8_linear_available(), "int8_linear needs AVX512-VNNI or AVX2 (this is the scalar tier)");
  llm_serve::check_int8_input(x);
  [[maybe_unused]] const int64_t M = x.size(0);
  const int64_t K = x.size(1);
  TORCH_CHECK(weights.is_contiguous() && weights.scalar_type() == at::kByte && weights.dim() == 4 &&
                  weights.size(1) == K / kQuad && weights.size(2) == kVector && weights.size(3) == kQuad,
              "weights: uint8 [out/16, in/4, 16, 4], contiguous");
  const int64_t N = weights.size(0) * kVector;
  TORCH_CHECK(w_scale.is_contiguous() && w_scale.scalar_type() == at::kFloat && w_scale.numel() == N,
              "w_scale: float32 [out], contiguous");
  TORCH_CHECK(K % kGroup == 0, "int8_linear: in_features must be a multiple of 64");
  return llm_serve::run_int8_kernel(x, N, float32_out, [&](const auto* xp, auto* out) {
#if defined(LLM_SERVE_INT8_DOT)
    run(xp, weights.data_ptr<uint8_t>(), w_scale.data_ptr<float>(), M, K, N, out);
#endif
  });
}

// silu_and_mul(int8_linear(x, weights, w_scale, false)) in one pass, for weights of [gate | up]
// (N / 2 outputs each, N / 2 a multiple of 16): out [M, N / 2] in x's dtype.
at::Tensor int8_linear_silu_mul(const at::Tensor& x, const at::Tensor& weights, const at::Tensor& w_scale) {
  TORCH_CHECK(int8_linear_available(), "int8_linear_silu_mul needs AVX512-VNNI or AVX2 (this is the scalar tier)");
  llm_serve::check_int8_input(x);
  [[maybe_unused]] const int64_t M = x.size(0);
  const int64_t K = x.size(1);
  TORCH_CHECK(weights.is_contiguous() && weights.scalar_type() == at::kByte && weights.dim() == 4 &&
                  weights.size(0) % 2 == 0 && weights.size(1) == K / kQuad && weights.size(2) == kVector &&
                  weights.size(3) == kQuad,
              "weights: uint8 [out/16, in/4, 16, 4] with an even out/16, contiguous");
  const int64_t N = weights.size(0) * kVector;
  TORCH_CHECK(w_scale.is_contiguous() && w_scale.scalar_type() == at::kFloat && w_scale.numel() == N,
              "w_scale: float32 [out], contiguous");
  TORCH_CHECK(K % kGroup == 0, "int8_linear_silu_mul: in_features must be a multiple of 64");
  return llm_serve::run_int8_kernel(x, N / 2, false, [&](const auto* xp, auto* out) {
#if defined(LLM_SERVE_INT8_DOT)
    run_silu(xp, weights.data_ptr<uint8_t>(), w_scale.data_ptr<float>(), M, K, N, out);
#endif
  });
}
