// Software prefetch of data a kernel streams from memory (K/V rows of a paged cache, weight
// codes), into the cache level that the build's CPU keeps the most misses in flight for.
//
// On AMD Zen 4 (the build defines LLM_SERVE_PREFETCH_L2 for AuthenticAMD CPUs) requests into
// L1 (PREFETCHT0) are held to the few misses L1 tracks: 2 KB blocks read in random order with
// each block's lines requested 4 blocks ahead gave 18 GB/s into L1 and 34 GB/s into L2
// (PREFETCHT1), against 26-31 GB/s for a sequential read on 2 threads. The loads then hit L2. On
// the Intel Xeon measured, requests into L1 were what gave the kernels their bandwidth, so other
// CPUs keep them.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace llm_serve {

#if defined(LLM_SERVE_PREFETCH_L2)
constexpr bool kPrefetchIntoL2 = true;
#else
constexpr bool kPrefetchIntoL2 = false;
#endif

// the cache line holding p
inline void prefetch_line(const void* p) {
  if constexpr (kPrefetchIntoL2)
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1);
  else
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
}

// the cache lines of `bytes` bytes from p
inline void prefetch_lines(const void* p, int64_t bytes) {
  for (int64_t off = 0; off < bytes; off += 64) prefetch_line(static_cast<const char*>(p) + off);
}

}  // namespace llm_serve
