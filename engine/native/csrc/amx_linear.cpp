// Linear layers for batches on Intel AMX: the GGUF's Q4_1 / Q8_0 codes de-quantized into bfloat16
// weight tiles next to the matrix unit, so a step of many rows reads the codes (a third of bf16's
// bytes) and still runs at the matrix unit's rate.
//
// The weights a tile holds are exactly the dense path's: w = d * q + m (Q4_1) or d * q (Q8_0) in
// float32 (exact: an fp16 d times a code of at most 8 bits), rounded to bfloat16 (nearest even), as
// GroupCodes.dequantize().to(bfloat16) rounds them. TDPBF16PS multiplies them by the bf16 inputs
// and adds in float32; out is float32 (logits) or x's dtype.
//
// The weights are the A operand (a tile row: one output's 32 inputs of a group, one scale and one
// minimum) and the inputs the B operand, so C is outputs x rows and is transposed on the way out.
// Why: a tile row of one output is made with one table lookup. A Q4_1 code has 16 values per
// output and group; VPERMW looks 32 words up in a 32-word table, so two outputs' tables (16 FMAs
// of d * [0..15] + m each, rounded to bf16 by one VCVTNE2PS2BF16) turn 64 codes into two tile rows
// in two lookups: ~10 vector instructions where converting each code to float32 took 18. The
// de-quantization, not the matrix unit, bounds a step of up to ~48 rows.
//
// Layout ("amx tiles", engine/models/gguf_codes.py packs them), per 16 outputs and group of 32
// inputs:
//   Q4_1 codes  uint8 [N/16, K/32, 8, 32]: byte k of block s holds output 2s's code for input k in
//               its low nibble and output 2s + 1's in its high nibble
//   Q8_0 codes  int8  [N/16, K/32, 16, 32]: output r's 32 codes
//   scales, mins float16 [N/16, K/32, 16] (mins: Q4_1 only)
// x [M, K] bfloat16 (K a multiple of 32), out [M, N] (N a multiple of 32).
//
// Every output's sum over K runs in the same tile instructions whatever the other rows are, so a
// row's result does not depend on the batch it is in.
#include "aten.h"

#include "amx_tiles.h"
#include "parallel.h"
#include "vec16.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kGroup = 32;
constexpr int64_t kTileN = 16;    // outputs per A tile
constexpr int64_t kTileM = 16;    // rows per B tile
constexpr int64_t kTileBytes = 1024;  // 16 rows x 64 bytes: every tile here
constexpr int64_t kPrefetchTiles = 24;
constexpr int64_t kDequantizeAhead = 1;
constexpr int64_t kRing = kDequantizeAhead + 1;  // groups of A tiles in flight

#if defined(LLM_SERVE_AMX)
using llm_serve::configure_tiles;
using llm_serve::request_amx;
using llm_serve::round_to;
using llm_serve::silu_mul16;
using llm_serve::store16;

enum class Format { kQ4_1, kQ8_0 };

// 16 vectors of 16 32-bit lanes transposed in place (r[i][j] <-> r[j][i])
inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // r[4b + j] now holds, in each 128-bit lane L, rows 4b..4b+3's column 4L + j
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xDD);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xDD);
  }
}

// The B tiles of x's rows m0..m0+15 (zeros past M): tile g, row p = the 16 rows' input pair
// (32g + 2p, 32g + 2p + 1), word 2t + i = row t's input 32g + 2p + i
inline void pack_inputs(const at::BFloat16* x, int64_t M, int64_t K, int64_t m0, uint8_t* tiles) {
  for (int64_t g = 0; g < K / kGroup; ++g) {
    __m512i r[16];
    for (int t = 0; t < 16; ++t)
      r[t] = m0 + t < M ? _mm512_loadu_si512(x + (m0 + t) * K + g * kGroup) : _mm512_setzero_si512();
    transpose16(r);
    for (int p = 0; p < 16; ++p) _mm512_store_si512(tiles + g * kTileBytes + p * 64, r[p]);
  }
}

// One A tile (16 outputs x one group) de-quantized into `tile` (1024 bytes): row r, word k the
// weight of output r at input k
template <Format F>
inline void dequantize_tile(const uint8_t* codes, const at::Half* scales, const at::Half* mins, uint8_t* tile) {
  alignas(64) float d[16], m[16];
  _mm512_store_ps(d, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales))));
  if constexpr (F == Format::kQ4_1) {
    _mm512_store_ps(m, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mins))));
    // each d[r], m[r] broadcast from memory (a load-port-only VBROADCASTSS): left to itself the
    // compiler takes them from the registers with VPERMD, on the shuffle port the lookups need
    asm volatile("" : : "r"(d), "r"(m) : "memory");
    const __m512 iota = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i low_nibble = _mm512_set1_epi16(0x0F), second_table = _mm512_set1_epi16(0x10);
    for (int s = 0; s < 8; ++s) {
      // words 0..15: output 2s's 16 possible weights, words 16..31: output 2s + 1's
      const __m512 w0 = _mm512_fmadd_ps(iota, _mm512_set1_ps(d[2 * s]), _mm512_set1_ps(m[2 * s]));
      const __m512 w1 = _mm512_fmadd_ps(iota, _mm512_set1_ps(d[2 * s + 1]), _mm512_set1_ps(m[2 * s + 1]));
      const __m512i table = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(w1, w0));
      const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + s * 32)));
      _mm512_store_si512(tile + (2 * s) * 64, _mm512_permutexvar_epi16(_mm512_and_si512(b, low_nibble), table));
      _mm512_store_si512(tile + (2 * s + 1) * 64,
                         _mm512_permutexvar_epi16(_mm512_or_si512(_mm512_srli_epi16(b, 4), second_table), table));
    }
  } else {
    for (int r = 0; r < 16; ++r) {
      const auto* q = reinterpret_cast<const __m128i*>(codes + r * 32);
      const __m512 dr = _mm512_set1_ps(d[r]);
      const __m512 lo = _mm512_mul_ps(dr, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q))));
      const __m512 hi = _mm512_mul_ps(dr, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1))));
      _mm512_store_si512(tile + r * 64, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
    }
  }
}

// Rows r0.. (up to 16, fewer past M) of out, columns n0..n0+15, from c [16 outputs][16 rows]
template <typename Out>
inline void store_transposed(const float* c, Out* out, int64_t ld, int64_t r0, int64_t n0, int64_t M) {
  __m512i r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(c + i * 16);
  transpose16(r);
  for (int64_t t = 0; t < kTileM && r0 + t < M; ++t) store16(out + (r0 + t) * ld + n0, _mm512_castsi512_ps(r[t]));
}

// 64-byte-aligned per-thread buffers that grow as needed
inline uint8_t* aligned_buffer(std::vector<uint8_t>& storage, size_t bytes) {
  if (storage.size() < bytes + 64) storage.resize(bytes + 64);
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(storage.data()) + 63) & ~uintptr_t{63});
}

template <Format F, bool Gated, typename Out>
void amx_linear_impl(const at::BFloat16* x, int64_t M, int64_t K, const uint8_t* codes, const at::Half* scales,
                     const at::Half* mins, Out* out, int64_t N) {
  const int64_t G = K / kGroup, tile_code_bytes = F == Format::kQ4_1 ? 256 : 512;
  const int64_t pairs = N / (2 * kTileN);
  const int64_t row_blocks = (M + kTileM - 1) / kTileM;
  llm_serve::parallel_chunks(0, pairs, 1, [&](llm_serve::Chunks& chunks) {
    configure_tiles();
    // every row block's B tiles, made by each thread for itself (x is small beside the weights:
    // a few microseconds, against a second pass over memory to share them)
    thread_local std::vector<uint8_t> input_storage, weight_storage;
    uint8_t* xb = aligned_buffer(input_storage, row_blocks * G * kTileBytes);
    for (int64_t rb = 0; rb < row_blocks; ++rb) pack_inputs(x, M, K, rb * kTileM, xb + rb * G * kTileBytes);
    // this pair's two sets of 16 outputs de-quantized: over the whole K ([2][G] tiles) where later
    // rows read them again; for one chunk of rows, a ring of the groups in flight ([kRing][2]),
    // which stays in L1 beside the packed rows
    const bool ring = row_blocks <= 2;
    uint8_t* a = aligned_buffer(weight_storage, (ring ? 2 * kRing : 2 * G) * kTileBytes);
    const auto a_tile = [&](int s, int64_t g) { return a + (ring ? (g % kRing) * 2 + s : s * G + g) * kTileBytes; };
    alignas(64) float c[4][kTileN * kTileM];
    // one pair of 16-output tiles over every row
    const auto run_pair = [&](int64_t pair) {
      // tile s (the pair's first or second 16 outputs) of group g
      const auto dequantize = [&](int s, int64_t g) {
        const int64_t tile = (Gated ? pair + s * pairs : 2 * pair + s) * G + g;
        const uint8_t* ahead = codes + (tile + kPrefetchTiles) * tile_code_bytes;
        for (int64_t off = 0; off < tile_code_bytes; off += 64)
          _mm_prefetch(reinterpret_cast<const char*>(ahead + off), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(scales + (tile + kPrefetchTiles) * kTileN), _MM_HINT_T0);
        if constexpr (F == Format::kQ4_1)
          _mm_prefetch(reinterpret_cast<const char*>(mins + (tile + kPrefetchTiles) * kTileN), _MM_HINT_T0);
        dequantize_tile<F>(codes + tile * tile_code_bytes, scales + tile * kTileN,
                           F == Format::kQ4_1 ? mins + tile * kTileN : nullptr, a_tile(s, g));
      };
      // each group's tiles de-quantized one group before the matrix unit first takes them (for the
      // first 32 rows), so a tile load never waits for the stores that made its tile; later rows
      // read them from the buffer. The next group's two tiles are made one beside each half of this
      // group's products (tile 0's products, next tile 0, tile 1's products, next tile 1): with all
      // of them after the products the vector and matrix units barely overlapped (32 rows: 2.13 ->
      // 1.83 ms for 30 gate/up layers). C tiles: 4 + s (outputs s, row block 0), 6 + s (block 1)
      for (int64_t rb0 = 0; rb0 < row_blocks; rb0 += 2) {
        const bool two = rb0 + 1 < row_blocks;
        _tile_zero(4);
        _tile_zero(5);
        _tile_zero(6);
        _tile_zero(7);
        const uint8_t* b0 = xb + rb0 * G * kTileBytes;
        if (rb0 == 0)
          for (int64_t g = 0; g < std::min<int64_t>(kDequantizeAhead, G); ++g) {
            dequantize(0, g);
            dequantize(1, g);
          }
        for (int64_t g = 0; g < G; ++g) {
          const bool ahead = rb0 == 0 && g + kDequantizeAhead < G;
          _tile_loadd(0, a_tile(0, g), 64);
          _tile_loadd(2, b0 + g * kTileBytes, 64);
          _tile_dpbf16ps(4, 0, 2);
          if (two) {
            _tile_loadd(3, b0 + (G + g) * kTileBytes, 64);
            _tile_dpbf16ps(6, 0, 3);
          }
          if (ahead) dequantize(0, g + kDequantizeAhead);
          _tile_loadd(1, a_tile(1, g), 64);
          _tile_dpbf16ps(5, 1, 2);
          if (two) _tile_dpbf16ps(7, 1, 3);
          if (ahead) dequantize(1, g + kDequantizeAhead);
        }
        _tile_stored(4, c[0], 64);
        _tile_stored(5, c[1], 64);
        _tile_stored(6, c[2], 64);
        _tile_stored(7, c[3], 64);
        for (int rb = 0; rb < (two ? 2 : 1); ++rb) {
          const int64_t r0 = (rb0 + rb) * kTileM;
          const float* gate_or_first = c[2 * rb];
          const float* up_or_second = c[2 * rb + 1];
          if constexpr (Gated) {  // silu(gate) * up, rounded to bf16 as silu_and_mul rounds it by the store
            alignas(64) float result[kTileN * kTileM];
            for (int o = 0; o < kTileN; ++o) {
              const __m512 gate = round_to<at::BFloat16>(_mm512_load_ps(gate_or_first + o * kTileM));
              const __m512 up = round_to<at::BFloat16>(_mm512_load_ps(up_or_second + o * kTileM));
              _mm512_store_ps(result + o * kTileM, silu_mul16<at::BFloat16>(gate, up));
            }
            store_transposed(result, out, N / 2, r0, pair * kTileN, M);
          } else {
            store_transposed(gate_or_first, out, N, r0, 2 * pair * kTileN, M);
            store_transposed(up_or_second, out, N, r0, (2 * pair + 1) * kTileN, M);
          }
        }
      }
    };
    int64_t lo, hi;
    while (chunks.next(lo, hi))
      for (int64_t pair = lo; pair < hi; ++pair) run_pair(pair);
    _tile_release();
  });
}
#endif

}  // namespace

bool amx_linear_available() {
#if defined(LLM_SERVE_AMX)
  return request_amx();
#else
  return false;
#endif
}

namespace {
// the checks both entry points make; q4: the format is Q4_1
bool check_amx_inputs(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                      const std::string& format) {
  TORCH_CHECK(amx_linear_available(), "amx_linear: this build or CPU has no AMX-BF16");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(), "x: contiguous bf16 [rows, in]");
  TORCH_CHECK(format == "q4_1" || format == "q8_0", "format q4_1 or q8_0");
  const bool q4 = format == "q4_1";
  TORCH_CHECK(codes.dim() == 4 && codes.is_contiguous() && scales.is_contiguous() && scales.dim() == 3,
              "codes [out/16, in/32, 8 or 16, 32], scales [out/16, in/32, 16]");
  TORCH_CHECK(x.size(1) == codes.size(1) * kGroup && codes.size(2) == (q4 ? 8 : 16) && codes.size(3) == 32 &&
                  codes.size(0) * kTileN % (2 * kTileN) == 0,
              "codes do not match x, or outputs not a multiple of 32");
  TORCH_CHECK(!q4 || (mins.is_contiguous() && mins.sizes() == scales.sizes()), "q4_1 needs mins like scales");
  return q4;
}

// amx_linear_impl for the format the inputs checked to; out [M, N] (Gated: [M, N / 2])
template <bool Gated, typename Out>
void run_amx(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins, bool q4,
             Out* out) {
#if defined(LLM_SERVE_AMX)
  const int64_t M = x.size(0), K = x.size(1), N = codes.size(0) * kTileN;
  const auto* c = static_cast<const uint8_t*>(codes.data_ptr());
  const auto* s = scales.data_ptr<at::Half>();
  const at::Half* mn = q4 ? mins.data_ptr<at::Half>() : nullptr;
  const auto* xp = x.data_ptr<at::BFloat16>();
  if (q4) amx_linear_impl<Format::kQ4_1, Gated>(xp, M, K, c, s, mn, out, N);
  else amx_linear_impl<Format::kQ8_0, Gated>(xp, M, K, c, s, mn, out, N);
#endif
}
}  // namespace

at::Tensor amx_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                      const std::string& format, bool float32_out) {
  const bool q4 = check_amx_inputs(x, codes, scales, mins, format);
  auto out = at::empty({x.size(0), codes.size(0) * kTileN}, x.options().dtype(float32_out ? at::kFloat : at::kBFloat16));
  if (float32_out) run_amx<false>(x, codes, scales, mins, q4, out.data_ptr<float>());
  else run_amx<false>(x, codes, scales, mins, q4, out.data_ptr<at::BFloat16>());
  return out;
}

at::Tensor amx_linear_silu_mul(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                               const at::Tensor& mins, const std::string& format) {
  const bool q4 = check_amx_inputs(x, codes, scales, mins, format);
  auto out = at::empty({x.size(0), codes.size(0) * kTileN / 2}, x.options());
  run_amx<true>(x, codes, scales, mins, q4, out.data_ptr<at::BFloat16>());
  return out;
}
