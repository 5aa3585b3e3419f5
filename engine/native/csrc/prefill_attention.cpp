// Paged prefill attention on the CPU: the rows of a step's prompt chunks (many query positions
// per sequence) against their sequence's keys, read from the paged cache through the block table
// after this step's K/V were written there, causal (the query at position p sees keys 0..p), with
// a cached prefix before the chunk or without.
//
// Shapes: q [rows, heads, head_dim] float32 or bfloat16, the chunks' rows one after another;
// k_cache, v_cache [kv_heads, num_blocks, block_size, head_dim] in q's dtype; block_tables [chunks, max_blocks] int32;
// query_starts [chunks + 1] int32 (chunk c owns rows query_starts[c]..query_starts[c + 1] - 1);
// context_lens [chunks] int32 (chunk c's keys in the cache after this step; its queries are the
// last positions of them); out like q.
//
// Why not torch's SDPA: for prompts of a few hundred tokens its CPU flash attention runs at
// 70-80 GFLOP/s (it works in key blocks of hundreds, mostly masked off), and the torch path calls
// it per sequence, after gathering a cached prefix's blocks into a copy.
//
// A work item is (chunk, kv head, kQueryTile positions): the rows of the GQA group's query heads at
// those positions. The item first copies the keys its rows can see into two packed buffers,
// shared by all its rows, in one of two forms (chosen below):
//  - float32 FMAs (every vector tier, float32 or bfloat16 inputs): K in tiles of 16 keys,
//    transposed to [dimension][16 keys], so one FMA with a query element broadcast adds to 16
//    keys' scores at once (no horizontal sums); V as rows.
//  - bfloat16 pairs (VDPBF16PS, two products per float32 lane): K in tiles of 16 keys as
//    [dimension pair][16 keys] words, so one VDPBF16PS with a query's dimension pair broadcast
//    adds two products to each of 16 keys' scores; V as pairs of keys interleaved word by word,
//    so one VDPBF16PS with the pair's two weights broadcast adds both keys' rows, 16 dimensions.
// Then a few rows at a time go over the tiles: all scores, one softmax per row (float32; each
// weight rounded to the inputs' dtype for the product with V, as torch's flash attention rounds
// its probabilities before that product), then the weighted sum of V. For bfloat16 inputs both
// forms multiply the same values exactly and add in float32; only the order of the additions
// differs.
//
// Which form: bfloat16 inputs take the pairs where the tier has AVX512-BF16. On the AMD EPYC (Zen
// 4, Zen 5) VDPBF16PS and a float32 FMA both issue once per cycle (measured), so VDPBF16PS does
// twice the FMAs' work; on the Xeons with AMX, VDPBF16PS issues once per two cycles, at the FMA's
// rate of products, and the matrix unit does both products instead (attend_rows_amx, below: the
// bfloat16 pairs' layouts are its tiles' own); a process the kernel refuses AMX tiles to takes the
// VDPBF16PS form over the same layouts. Float32 FMAs for float32 inputs, and on the other tiers.
#include "aten.h"

#include "amx_tiles.h"
#include "parallel.h"
#include "vec16.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(LLM_SERVE_VEC16)
#if defined(__AVX512BF16__)
#define PREFILL_BF16_PAIRS 1
#endif
#if defined(LLM_SERVE_AMX)
#define PREFILL_AMX 1
#endif
namespace {

using llm_serve::f32x16;

constexpr int kTileKeys = 16;   // keys per packed tile: one vector of scores
constexpr int kQueryTile = 16;  // query positions per work item

enum class Form { kFloat, kPairs };  // float32 FMAs, or bfloat16 pairs (VDPBF16PS / AMX)

// The packed keys and values of one item, head_dim = 32 * C2: float32, or bfloat16 pairs in words
//   float32:  keys [tiles][head_dim][16 keys]         values [tiles * 16][head_dim]
//   pairs:    keys [tiles][head_dim / 2][16 keys]     values [tiles * 8][head_dim]: keys 2i, 2i + 1
//             (a key's dimensions 2p, 2p + 1)                  of one dimension
template <Form F, int C2>
struct Packed {
  static constexpr int kHeadDim = 32 * C2;
  using Element = std::conditional_t<F == Form::kPairs, uint32_t, float>;
  static constexpr int kPerKey = F == Form::kPairs ? kHeadDim / 2 : kHeadDim;
  std::vector<Element> keys, values;

  void reserve(int tiles) {
    const size_t elements = static_cast<size_t>(tiles) * kTileKeys * kPerKey;
    if (keys.size() < elements) {
      keys.resize(elements);
      values.resize(elements);
    }
  }
};

// each key's row offset in the cache for tile t of keys 0..num_keys-1; -1 past num_keys
inline void tile_offsets(const int32_t* table, int64_t block_size, int64_t head_dim, int num_keys, int t,
                         int64_t (&offsets)[kTileKeys]) {
  for (int j = 0; j < kTileKeys; ++j) {
    const int64_t key = t * kTileKeys + j;
    offsets[j] = key < num_keys ? (static_cast<int64_t>(table[key / block_size]) * block_size + key % block_size) * head_dim
                                : -1;
  }
}

// K and V tiles 0..tiles-1 of keys 0..num_keys-1 as float32 (past num_keys: zeros, so a weight of 0
// times a stale row cannot make a NaN) from the cache rows (T) of one kv head
template <int C2, typename T>
void pack(Packed<Form::kFloat, C2>& packed, const T* k_head, const T* v_head, const int32_t* table,
          int64_t block_size, int num_keys, int tiles) {
  constexpr int64_t head_dim = 32 * C2;
  for (int t = 0; t < tiles; ++t) {
    int64_t offsets[kTileKeys];
    tile_offsets(table, block_size, head_dim, num_keys, t, offsets);
    float* kt = packed.keys.data() + static_cast<size_t>(t) * kTileKeys * head_dim;
    float* vt = packed.values.data() + static_cast<size_t>(t) * kTileKeys * head_dim;
    for (int j = 0; j < kTileKeys; ++j) {
      if (offsets[j] < 0) {
        for (int64_t d = 0; d < head_dim; ++d) kt[d * kTileKeys + j] = 0.f;
        std::memset(vt + j * head_dim, 0, head_dim * sizeof(float));
        continue;
      }
      const T* k = k_head + offsets[j];
      for (int64_t d = 0; d < head_dim; ++d) kt[d * kTileKeys + j] = static_cast<float>(k[d]);  // K transposed
      for (int64_t d = 0; d < head_dim; d += 16) llm_serve::store16(vt + j * head_dim + d, llm_serve::load16(v_head + offsets[j] + d));
    }
  }
}

// scores[r][u * 16 + j] of R rows' queries (float32, scaled) against tiles t..t+T-1's keys (kt:
// tile t)
template <int C2, int R, int U>
inline void score_tiles(const float* kt, const float* const* q, float* const* scores) {
  using namespace llm_serve;  // NOLINT: the vector functions (vec16.h)
  constexpr int head_dim = 32 * C2;
  f32x16 s[R][U];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) s[r][u] = zero16();
  for (int d = 0; d < head_dim; ++d) {
    f32x16 k[U];
    for (int u = 0; u < U; ++u) k[u] = load16(kt + (u * head_dim + d) * kTileKeys);
    for (int r = 0; r < R; ++r) {
      const f32x16 qd = set16(q[r][d]);
      for (int u = 0; u < U; ++u) s[r][u] = fmadd(qd, k[u], s[r][u]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) store16(scores[r] + u * kTileKeys, s[r][u]);
}

#if defined(PREFILL_BF16_PAIRS)
// K and V tiles as bfloat16 pairs (the layouts above), from the bfloat16 cache rows of one kv head
template <int C2>
void pack(Packed<Form::kPairs, C2>& packed, const at::BFloat16* k_head, const at::BFloat16* v_head,
          const int32_t* table, int64_t block_size, int num_keys, int tiles) {
  constexpr int64_t head_dim = 32 * C2;
  constexpr int kPairs = 16 * C2;
  alignas(64) uint32_t k_rows[kTileKeys][kPairs];  // a tile's rows side by side, as dimension pairs
  const __m512i row_index = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                               _mm512_set1_epi32(kPairs));
  // words 2d, 2d + 1 of a key pair's word row: dimension d of the first key, then of the second
  alignas(64) int16_t interleave[2][32];
  for (int w = 0; w < 32; ++w) {
    interleave[0][w] = static_cast<int16_t>((w & 1 ? 32 : 0) + w / 2);
    interleave[1][w] = static_cast<int16_t>((w & 1 ? 32 : 0) + 16 + w / 2);
  }
  const __m512i low_half = _mm512_load_si512(interleave[0]), high_half = _mm512_load_si512(interleave[1]);
  for (int t = 0; t < tiles; ++t) {
    int64_t offsets[kTileKeys];
    tile_offsets(table, block_size, head_dim, num_keys, t, offsets);
    for (int j = 0; j < kTileKeys; ++j) {
      if (offsets[j] >= 0)
        std::memcpy(k_rows[j], k_head + offsets[j], head_dim * sizeof(at::BFloat16));
      else
        std::memset(k_rows[j], 0, sizeof(k_rows[j]));
    }
    // K transposed: one gather takes dimension pair p of the 16 keys
    uint32_t* kt = packed.keys.data() + static_cast<size_t>(t) * kTileKeys * kPairs;
    for (int p = 0; p < kPairs; ++p) _mm512_storeu_si512(kt + p * kTileKeys, _mm512_i32gather_epi32(row_index, &k_rows[0][p], 4));
    // V (past num_keys: zeros, so a weight of 0 times a stale row cannot make a NaN)
    uint32_t* vt = packed.values.data() + static_cast<size_t>(t) * kTileKeys * kPairs;
    for (int i = 0; i < kTileKeys / 2; ++i) {
      const int64_t a = offsets[2 * i], b = offsets[2 * i + 1];
      for (int d = 0; d < head_dim; d += 32) {
        const __m512i va = a >= 0 ? _mm512_loadu_si512(v_head + a + d) : _mm512_setzero_si512();
        const __m512i vb = b >= 0 ? _mm512_loadu_si512(v_head + b + d) : _mm512_setzero_si512();
        _mm512_storeu_si512(vt + i * head_dim + d, _mm512_permutex2var_epi16(va, low_half, vb));
        _mm512_storeu_si512(vt + i * head_dim + d + 16, _mm512_permutex2var_epi16(va, high_half, vb));
      }
    }
  }
}

// scores[r][u * 16 + j] of R rows' queries (bfloat16 dimension pairs) against tiles t..t+T-1's
// keys (kt: tile t), times the scale
template <int C2, int R, int U>
inline void score_tiles(const uint32_t* kt, const uint32_t* const* q, float scale, float* const* scores) {
  constexpr int pairs = 16 * C2;
  __m512 s[R][U];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) s[r][u] = _mm512_setzero_ps();
  for (int p = 0; p < pairs; ++p) {
    __m512i k[U];
    for (int u = 0; u < U; ++u) k[u] = _mm512_loadu_si512(kt + (u * pairs + p) * kTileKeys);
    for (int r = 0; r < R; ++r) {
      const __m512bh qp = (__m512bh)_mm512_set1_epi32(static_cast<int>(q[r][p]));
      for (int u = 0; u < U; ++u) s[r][u] = _mm512_dpbf16_ps(s[r][u], qp, (__m512bh)k[u]);
    }
  }
  const __m512 scale16 = _mm512_set1_ps(scale);
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) _mm512_storeu_ps(scores[r] + u * kTileKeys, _mm512_mul_ps(s[r][u], scale16));
}
#endif

// Per-thread buffers of an item's rows (T: the inputs' dtype).
template <typename T>
struct RowBuffers {
  std::vector<const T*> rows;  // each row's query
  std::vector<T*> outs;        // where its result goes
  std::vector<int> limits;                // how many keys it sees
  std::vector<int> block_tiles;           // tiles each block of R rows sees
  std::vector<float> queries;  // [rows][head_dim], scaled (float32 FMAs); then one inverse sum per row
  std::vector<float> scores;   // [rows][width]: the scores, then (float32 FMAs) the weights in their place
  std::vector<float> sums;     // [rows][head_dim]: the weighted sums of V
  std::vector<uint32_t> query_pairs;  // [rows][head_dim / 2]: the queries as bfloat16 pairs (VDPBF16PS)
  std::vector<uint16_t> weights;      // [rows][width]: the weights' bfloat16 bits (VDPBF16PS)

  // block_tiles[b]: the key tiles that rows b * R .. b * R + R - 1 see, rounded up to a multiple of
  // `multiple`; every buffer sized for num_rows rows of head_dim and of the most tiles. Returns
  // the scores' width (keys per row).
  int64_t prepare(int num_rows, const int* limits, int R, int multiple, int head_dim) {
    block_tiles.assign(num_rows / R, 0);
    for (int r = 0; r < num_rows; ++r)
      block_tiles[r / R] = std::max(block_tiles[r / R], (limits[r] + kTileKeys - 1) / kTileKeys);
    int tiles = 0;
    for (int& t : block_tiles) {
      t = (t + multiple - 1) / multiple * multiple;
      tiles = std::max(tiles, t);
    }
    const int64_t width = static_cast<int64_t>(tiles) * kTileKeys;
    const auto grow = [](auto& buffer, int64_t n) {
      if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
    };
    grow(scores, num_rows * width);
    grow(weights, num_rows * width);
    grow(queries, num_rows * head_dim);
    grow(sums, num_rows * head_dim);
    grow(query_pairs, num_rows * head_dim / 2);
    return width;
  }
};

// Pass 2 of attend_rows: per row, weights exp(scale * score - max) rounded to T (as torch's flash
// attention rounds them before the product with V), 0 past the row's keys up to its block's last
// tile (block_tiles[r / R]); 1 / the sum of the rounded ones into inverse_sum[r]. The weights go in
// the scores' place as float32, or (pairs) their bfloat16 bits to `weights` [rows][width]. `scale`:
// 1 where the scores were scaled as they were made (an exact product).
template <Form F, typename T>
inline void row_weights(float* scores, int64_t width, int num_rows, const int* limits,
                        const std::vector<int>& block_tiles, int R, float scale, [[maybe_unused]] uint16_t* weights,
                        float* inverse_sum) {
  using namespace llm_serve;  // NOLINT: the vector functions (vec16.h)
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const f32x16 scale16 = set16(scale);
  for (int r = 0; r < num_rows; ++r) {
    float* s = scores + r * width;
    const int visible_tiles = (limits[r] + kTileKeys - 1) / kTileKeys;
    const auto valid = [&](int tile) { return std::clamp(limits[r] - tile * kTileKeys, 0, kTileKeys); };
    f32x16 running = set16(neg_inf);
    for (int u = 0; u < visible_tiles; ++u)
      running = llm_serve::max(running, first_lanes(mul(load16(s + u * kTileKeys), scale16), valid(u), neg_inf));
    const f32x16 row_max = set16(reduce_max(running));
    f32x16 total = zero16();
    for (int u = 0; u < block_tiles[r / R]; ++u) {
      const f32x16 score = mul(load16(s + u * kTileKeys), scale16);
      const f32x16 rounded = round_to<T>(first_lanes(exp16(sub(score, row_max)), valid(u)));
#if defined(PREFILL_BF16_PAIRS)
      if constexpr (F == Form::kPairs) {  // the rounded values' top halves: their bfloat16 bits
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(weights + r * width + u * kTileKeys),
                            _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(rounded), 16)));
      } else {
        store16(s + u * kTileKeys, rounded);
      }
#else
      store16(s + u * kTileKeys, rounded);
#endif
      total = add(total, rounded);
    }
    inverse_sum[r] = 1.f / reduce_add(total);
  }
}

// Each row's result: its weighted sum of V (sums [rows][head_dim]) times 1 / its weights' sum
template <int C2, typename T>
inline void write_rows(const float* sums, const float* inverse_sum, int num_rows, T* const* outs) {
  constexpr int head_dim = 32 * C2;
  for (int r = 0; r < num_rows; ++r)
    for (int c = 0; c < 2 * C2; ++c)
      llm_serve::store16(outs[r] + 16 * c, llm_serve::mul(llm_serve::load16(sums + r * head_dim + 16 * c),
                                                          llm_serve::set16(inverse_sum[r])));
}

// An item's rows (a multiple of R; rows[r] points at row r's query, limits[r] is how many keys it
// sees, at least 1, outs[r] where its result goes) against its packed tiles, in three passes over
// the keys: every score, then one softmax per row (no running maximum, no rescaling), then the
// weighted sum of V. Each pass goes a few tiles at a time through all rows, R rows per register
// block, so the tiles in hand stay in L1 while every row uses them (a row block at a time over
// all tiles read each tile from L2 once per 4 rows, and ran at the speed of L2).
template <Form F, typename T, int C2, int R>
void attend_rows(const Packed<F, C2>& packed, int num_rows, const T* const* rows, const int* limits, T* const* outs,
                 float scale, RowBuffers<T>& buffers) {
  constexpr int head_dim = 32 * C2;
  constexpr size_t tile_elements = kTileKeys * Packed<F, C2>::kPerKey;  // of one tile's K, or V
  const int blocks = num_rows / R;
  const int64_t width = buffers.prepare(num_rows, limits, R, 1, head_dim);
  const std::vector<int>& block_tiles = buffers.block_tiles;
  const int tiles = static_cast<int>(width / kTileKeys);
  float* scores = buffers.scores.data();
  using Query = typename Packed<F, C2>::Element;  // float32 scaled, or bfloat16 pairs
  Query* queries;
  if constexpr (F == Form::kPairs) {
    queries = buffers.query_pairs.data();
    for (int r = 0; r < num_rows; ++r) std::memcpy(queries + r * head_dim / 2, rows[r], head_dim * sizeof(T));
  } else {
    queries = buffers.queries.data();
    for (int r = 0; r < num_rows; ++r)
      for (int d = 0; d < head_dim; d += 16)
        llm_serve::store16(queries + r * head_dim + d, llm_serve::mul(llm_serve::load16(rows[r] + d), llm_serve::set16(scale)));
  }

  // 1. scores, two tiles at a time through every row block that sees them (2R independent sums)
  for (int t = 0; t < tiles; t += 2) {
    const Query* kt = packed.keys.data() + t * tile_elements;
    for (int b = 0; b < blocks; ++b) {
      if (block_tiles[b] <= t) continue;
      float* dst[R];
      const Query* q[R];
      for (int r = 0; r < R; ++r) {
        dst[r] = scores + (b * R + r) * width + t * kTileKeys;
        q[r] = queries + (b * R + r) * Packed<F, C2>::kPerKey;
      }
#if defined(PREFILL_BF16_PAIRS)
      if constexpr (F == Form::kPairs) {
        if (t + 1 < block_tiles[b])
          score_tiles<C2, R, 2>(kt, q, scale, dst);
        else
          score_tiles<C2, R, 1>(kt, q, scale, dst);
        continue;
      }
#endif
      if constexpr (F == Form::kFloat) {
        if (t + 1 < block_tiles[b])
          score_tiles<C2, R, 2>(kt, q, dst);
        else
          score_tiles<C2, R, 1>(kt, q, dst);
      }
    }
  }

  // 2. weights (the scores were scaled as they were made)
  float* inverse_sum = buffers.queries.data();  // the float32 queries are done with: one per row
  row_weights<F, T>(scores, width, num_rows, limits, block_tiles, R, 1.f, buffers.weights.data(), inverse_sum);

  // 3. the weighted sum of V, a tile of keys at a time through every row block that sees it, the
  // block's sums in registers over the tile
  float* sums = buffers.sums.data();
  std::memset(sums, 0, sizeof(float) * num_rows * head_dim);
  for (int t = 0; t < tiles; ++t) {
    const Query* values = packed.values.data() + t * tile_elements;
    for (int b = 0; b < blocks; ++b) {
      if (block_tiles[b] <= t) continue;
      float* block_sums = sums + b * R * head_dim;
      f32x16 acc[R][2 * C2];
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < 2 * C2; ++c) acc[r][c] = llm_serve::load16(block_sums + r * head_dim + 16 * c);
#if defined(PREFILL_BF16_PAIRS)
      if constexpr (F == Form::kPairs) {
        const uint16_t* w = buffers.weights.data() + b * R * width + t * kTileKeys;
        for (int i = 0; i < kTileKeys / 2; ++i) {  // keys 2i, 2i + 1
          __m512i v[2 * C2];
          for (int c = 0; c < 2 * C2; ++c) v[c] = _mm512_loadu_si512(values + i * head_dim + 16 * c);
          for (int r = 0; r < R; ++r) {
            uint32_t two;
            std::memcpy(&two, w + r * width + 2 * i, sizeof(two));
            const __m512bh wr = (__m512bh)_mm512_set1_epi32(static_cast<int>(two));
            for (int c = 0; c < 2 * C2; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], wr, (__m512bh)v[c]);
          }
        }
      }
#endif
      if constexpr (F == Form::kFloat) {
        const float* w = scores + b * R * width + t * kTileKeys;
        for (int j = 0; j < kTileKeys; ++j) {
          f32x16 v[2 * C2];
          for (int c = 0; c < 2 * C2; ++c) v[c] = llm_serve::load16(values + j * head_dim + 16 * c);
          for (int r = 0; r < R; ++r) {
            const f32x16 wr = llm_serve::set16(w[r * width + j]);
            for (int c = 0; c < 2 * C2; ++c) acc[r][c] = llm_serve::fmadd(wr, v[c], acc[r][c]);
          }
        }
      }
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < 2 * C2; ++c) llm_serve::store16(block_sums + r * head_dim + 16 * c, acc[r][c]);
    }
  }
  write_rows<C2>(sums, inverse_sum, num_rows, outs);
}

#if defined(PREFILL_AMX)
constexpr int kAmxRows = 16;  // rows per block of attend_rows_amx: one tile's

// attend_rows on the matrix unit (TDPBF16PS: bfloat16 products, float32 sums), over blocks of 16
// rows, the packed tiles as they are:
//  1. scores: A = 16 rows' queries (32 dimensions per tile), B = a key tile's K (16 dimension
//     pairs x 16 keys, the packed layout), C = [16 rows][16 keys], stored unscaled into the scores;
//  2. row_weights (the scale applied there);
//  3. the weighted sum of V: A = 16 rows' weights of 32 keys (two key tiles), B = their V (16 key
//     pairs x 16 dimensions, the packed layout read with the row's stride), C = [16 rows][16
//     dimensions], 64 dimensions per pass in tiles 4..7 over all the block's keys.
// A block's tiles are rounded up to an even number (pairs of key tiles for pass 3): the extra
// tile's keys are packed as zeros and their weights are 0. Tiles: 0..C2-1 queries, 4 and 5 K, 6
// and 7 scores (pass 1), then 0 weights, 1 and 2 V, 4..7 sums (pass 3).
template <int C2>
void attend_rows_amx(const Packed<Form::kPairs, C2>& packed, int num_rows, const at::BFloat16* const* rows,
                     const int* limits, at::BFloat16* const* outs, float scale, RowBuffers<at::BFloat16>& buffers) {
  constexpr int head_dim = 32 * C2, pairs = head_dim / 2;
  constexpr size_t tile_elements = kTileKeys * Packed<Form::kPairs, C2>::kPerKey;
  const int blocks = num_rows / kAmxRows;
  const int64_t width = buffers.prepare(num_rows, limits, kAmxRows, 2, head_dim);  // pairs of key tiles
  const std::vector<int>& block_tiles = buffers.block_tiles;
  float* scores = buffers.scores.data();
  uint16_t* weights = buffers.weights.data();
  uint32_t* queries = buffers.query_pairs.data();
  for (int r = 0; r < num_rows; ++r) std::memcpy(queries + r * pairs, rows[r], head_dim * sizeof(at::BFloat16));

  // 1. scores
  for (int b = 0; b < blocks; ++b) {
    const uint32_t* q = queries + b * kAmxRows * pairs;
    _tile_loadd(0, q, pairs * 4);
    _tile_loadd(1, q + 16, pairs * 4);
    if constexpr (C2 == 4) {
      _tile_loadd(2, q + 32, pairs * 4);
      _tile_loadd(3, q + 48, pairs * 4);
    }
    // two key tiles at a time (block_tiles[b] is even), so one's products run while the other's
    // scores are stored
    for (int t = 0; t < block_tiles[b]; t += 2) {
      const uint32_t* kt = packed.keys.data() + t * tile_elements;  // [pairs][16 keys]
      const uint32_t* next = kt + tile_elements;
      _tile_zero(6);
      _tile_zero(7);
      _tile_loadd(4, kt, 64);
      _tile_dpbf16ps(6, 0, 4);
      _tile_loadd(5, next, 64);
      _tile_dpbf16ps(7, 0, 5);
      _tile_loadd(4, kt + 16 * kTileKeys, 64);
      _tile_dpbf16ps(6, 1, 4);
      _tile_loadd(5, next + 16 * kTileKeys, 64);
      _tile_dpbf16ps(7, 1, 5);
      if constexpr (C2 == 4) {
        _tile_loadd(4, kt + 32 * kTileKeys, 64);
        _tile_dpbf16ps(6, 2, 4);
        _tile_loadd(5, next + 32 * kTileKeys, 64);
        _tile_dpbf16ps(7, 2, 5);
        _tile_loadd(4, kt + 48 * kTileKeys, 64);
        _tile_dpbf16ps(6, 3, 4);
        _tile_loadd(5, next + 48 * kTileKeys, 64);
        _tile_dpbf16ps(7, 3, 5);
      }
      float* dst = scores + b * kAmxRows * width + t * kTileKeys;
      _tile_stored(6, dst, width * 4);
      _tile_stored(7, dst + kTileKeys, width * 4);
    }
  }

  // 2. weights
  float* inverse_sum = buffers.queries.data();
  row_weights<Form::kPairs, at::BFloat16>(scores, width, num_rows, limits, block_tiles, kAmxRows, scale, weights,
                                          inverse_sum);

  // 3. the weighted sum of V
  float* sums = buffers.sums.data();
  for (int b = 0; b < blocks; ++b) {
    for (int half = 0; half < C2 / 2; ++half) {
      _tile_zero(4);
      _tile_zero(5);
      _tile_zero(6);
      _tile_zero(7);
      for (int t = 0; t < block_tiles[b]; t += 2) {
        // key pairs 8t .. 8t + 15, each a row of head_dim words; dimensions 64 * half + 16 * c
        const uint32_t* v = packed.values.data() + t * tile_elements + 64 * half;
        _tile_loadd(0, weights + b * kAmxRows * width + t * kTileKeys, width * 2);
        _tile_loadd(1, v, head_dim * 4);
        _tile_dpbf16ps(4, 0, 1);
        _tile_loadd(2, v + 16, head_dim * 4);
        _tile_dpbf16ps(5, 0, 2);
        _tile_loadd(1, v + 32, head_dim * 4);
        _tile_dpbf16ps(6, 0, 1);
        _tile_loadd(2, v + 48, head_dim * 4);
        _tile_dpbf16ps(7, 0, 2);
      }
      float* block_sums = sums + b * kAmxRows * head_dim + 64 * half;
      _tile_stored(4, block_sums, head_dim * 4);
      _tile_stored(5, block_sums + 16, head_dim * 4);
      _tile_stored(6, block_sums + 32, head_dim * 4);
      _tile_stored(7, block_sums + 48, head_dim * 4);
    }
  }
  write_rows<C2>(sums, inverse_sum, num_rows, outs);
}
#endif

// The chunks' items, each thread a range of them, in form F over inputs of T
template <Form F, typename T, int C2>
void run_items(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
               const at::Tensor& block_tables, const at::Tensor& query_starts, const at::Tensor& context_lens,
               double scale, at::Tensor& out) {
  constexpr int64_t head_dim = 32 * C2;
  // rows at a time: their sums fill half the vector registers (AVX-512's 32; AVX2's 16 registers
  // take two per 16 lanes), or one tile's (the matrix unit)
#if defined(__AVX512F__)
  constexpr int kVectorRows = C2 == 2 ? 4 : 2;
#else
  constexpr int kVectorRows = C2 == 2 ? 2 : 1;
#endif
#if defined(PREFILL_AMX)
  const bool amx = F == Form::kPairs && llm_serve::request_amx();
#else
  constexpr bool amx = false;
#endif
  const int R = amx ? 16 : kVectorRows;
  const int64_t num_chunks = context_lens.size(0), num_heads = q.size(1);
  const int64_t num_kv_heads = k_cache.size(0), block_size = k_cache.size(2);
  const int64_t group = num_heads / num_kv_heads, max_blocks = block_tables.size(1);
  const int32_t* starts = query_starts.data_ptr<int32_t>();
  const int32_t* lens = context_lens.data_ptr<int32_t>();
  // work items: (chunk, kv head, tile of kQueryTile positions), the chunks' tiles in order
  std::vector<int64_t> first_item(num_chunks + 1, 0);
  for (int64_t c = 0; c < num_chunks; ++c)
    first_item[c + 1] = first_item[c] + num_kv_heads * ((starts[c + 1] - starts[c] + kQueryTile - 1) / kQueryTile);
  const T* qp = q.data_ptr<T>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  T* op = out.data_ptr<T>();
  const float scale_f = static_cast<float>(scale);
  llm_serve::parallel_for(0, first_item[num_chunks], 1, [&](int64_t lo, int64_t hi) {
#if defined(PREFILL_AMX)
    if (amx) llm_serve::configure_tiles();
#endif
    thread_local Packed<F, C2> packed;
    thread_local RowBuffers<T> buffers;
    const size_t max_rows = (kQueryTile * group + R - 1) / R * R;
    buffers.rows.resize(max_rows);
    buffers.outs.resize(max_rows);
    buffers.limits.resize(max_rows);
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t chunk = std::upper_bound(first_item.begin(), first_item.end(), item) - first_item.begin() - 1;
      const int64_t index = item - first_item[chunk];
      const int64_t h = index % num_kv_heads, tile = index / num_kv_heads;
      const int64_t query_len = starts[chunk + 1] - starts[chunk];
      const int64_t first_position = lens[chunk] - query_len;  // of the chunk's first query
      const int64_t p0 = tile * kQueryTile, p1 = std::min<int64_t>(query_len, p0 + kQueryTile);
      const int num_keys = static_cast<int>(first_position + p1);  // what the tile's last row sees
      int tiles = (num_keys + kTileKeys - 1) / kTileKeys;
      tiles += amx ? tiles % 2 : 0;  // pairs of key tiles (attend_rows_amx)
      packed.reserve(tiles);
      pack<C2>(packed, kp + h * k_cache.stride(0), vp + h * v_cache.stride(0), tables + chunk * max_blocks,
               block_size, num_keys, tiles);
      // the item's rows: positions p0..p1-1, each with the group's query heads; padded to a
      // multiple of R with the last row again (computed twice, written twice, the same)
      const int num_rows = static_cast<int>((p1 - p0) * group);
      const int padded = (num_rows + R - 1) / R * R;
      for (int r = 0; r < padded; ++r) {
        const int64_t row = std::min(r, num_rows - 1);
        const int64_t position = p0 + row / group;
        const int64_t offset = ((starts[chunk] + position) * num_heads + h * group + row % group) * head_dim;
        buffers.rows[r] = qp + offset;
        buffers.outs[r] = op + offset;
        buffers.limits[r] = static_cast<int>(first_position + position + 1);
      }
#if defined(PREFILL_AMX)
      if constexpr (F == Form::kPairs) {
        if (amx) {
          attend_rows_amx<C2>(packed, padded, buffers.rows.data(), buffers.limits.data(), buffers.outs.data(),
                              scale_f, buffers);
          continue;
        }
      }
#endif
      attend_rows<F, T, C2, kVectorRows>(packed, padded, buffers.rows.data(), buffers.limits.data(),
                                         buffers.outs.data(), scale_f, buffers);
    }
#if defined(PREFILL_AMX)
    if (amx) _tile_release();
#endif
  });
}

// bfloat16 inputs in pairs where the tier has AVX512-BF16; float32 FMAs otherwise
template <typename T, int C2>
void prefill_attention_impl(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& block_tables, const at::Tensor& query_starts,
                            const at::Tensor& context_lens, double scale, at::Tensor& out) {
#if defined(PREFILL_BF16_PAIRS)
  if constexpr (std::is_same_v<T, at::BFloat16>) {
    run_items<Form::kPairs, T, C2>(q, k_cache, v_cache, block_tables, query_starts, context_lens, scale, out);
    return;
  }
#endif
  run_items<Form::kFloat, T, C2>(q, k_cache, v_cache, block_tables, query_starts, context_lens, scale, out);
}

}  // namespace
#endif  // LLM_SERVE_VEC16

bool prefill_attention_available() {
#if defined(LLM_SERVE_VEC16)
  return true;
#else
  return false;
#endif
}

at::Tensor paged_prefill_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                   const at::Tensor& block_tables, const at::Tensor& query_starts,
                                   const at::Tensor& context_lens, double scale) {
  TORCH_CHECK(prefill_attention_available(), "paged_prefill_attention: not in the scalar tier");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), "bad shapes");
  TORCH_CHECK((q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kFloat) &&
                  k_cache.scalar_type() == q.scalar_type() && v_cache.scalar_type() == q.scalar_type(),
              "paged_prefill_attention: float32 or bfloat16 q, the caches in its dtype");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(), "inputs must be contiguous");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && query_starts.scalar_type() == at::kInt &&
                  context_lens.scalar_type() == at::kInt, "block_tables, query_starts, context_lens: int32");
  TORCH_CHECK(query_starts.size(0) == context_lens.size(0) + 1 && block_tables.size(0) == context_lens.size(0),
              "one table and one context length per chunk, chunks + 1 query starts");
  TORCH_CHECK(q.size(1) % k_cache.size(0) == 0, "query heads a multiple of kv heads");
  TORCH_CHECK(k_cache.size(3) == q.size(2) && (q.size(2) == 64 || q.size(2) == 128), "head_dim 64 or 128");
  auto tables = block_tables.contiguous();
  auto starts = query_starts.contiguous();
  auto lens = context_lens.contiguous();
  const int32_t* s = starts.data_ptr<int32_t>();
  const int32_t* l = lens.data_ptr<int32_t>();
  TORCH_CHECK(s[0] == 0 && s[lens.size(0)] == q.size(0), "query_starts must cover q's rows from 0");
  for (int64_t c = 0; c < lens.size(0); ++c)
    TORCH_CHECK(s[c + 1] >= s[c] && l[c] >= s[c + 1] - s[c] &&
                    (l[c] + k_cache.size(2) - 1) / k_cache.size(2) <= tables.size(1),
                "a chunk's context holds its queries and fits its block table");
  auto out = at::empty_like(q);
#if defined(LLM_SERVE_VEC16)
  const auto run = [&](auto element) {
    using T = decltype(element);
    if (q.size(2) == 64)
      prefill_attention_impl<T, 2>(q, k_cache, v_cache, tables, starts, lens, scale, out);
    else
      prefill_attention_impl<T, 4>(q, k_cache, v_cache, tables, starts, lens, scale, out);
  };
  if (q.scalar_type() == at::kBFloat16)
    run(at::BFloat16());
  else
    run(float());
#endif
  return out;
}
