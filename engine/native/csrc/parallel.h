// The kernels' parallel loop: each thread's contiguous share first, then the rest of the others'
// shares taken from their ends, so a thread that another process preempts delays the loop by no
// more than the chunk it is in.
//
// With a static split (at::parallel_for over OpenMP), when the HTTP server, the tokenizer worker
// or a load generator on the same cores takes one for a moment, the preempted thread's whole
// share waits for it while the other threads spin at the barrier: on two cores a neighbour
// using a fifth of one core slowed the engine by a third. Here the threads that are running take
// over the preempted thread's chunks that it has not started.
//
// Each share is one atomic word, (front << 32) | back, in chunks of `grain` items: its owner
// takes chunks from the front (in order, as a static split runs them, so the hardware prefetcher
// sees the same streams), the others from the back once their own share is done. Which thread
// runs a chunk never changes what the chunk computes, so results stay bitwise the same. A claim
// costs ~40 ns (an empty loop of 96 chunks on two threads: 4.5 us against 0.9 for 2): the codes
// kernel's chunks of 4 panels (~0.5 us at one row) pay a few percent for it, and chunks of 16
// lost more (batch-1 decode 0.87x) to shares of a few coarse chunks.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace llm_serve {

namespace detail {

struct alignas(64) Share {
  std::atomic<uint64_t> range{0};  // (front << 32) | back, in chunks; empty when front >= back
};

inline bool take_front(Share& share, int64_t& chunk) {
  uint64_t v = share.range.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t front = v >> 32, back = v & 0xFFFFFFFFu;
    if (front >= back) return false;
    if (share.range.compare_exchange_weak(v, ((front + 1) << 32) | back, std::memory_order_relaxed)) {
      chunk = static_cast<int64_t>(front);
      return true;
    }
  }
}

inline bool take_back(Share& share, int64_t& chunk) {
  uint64_t v = share.range.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t front = v >> 32, back = v & 0xFFFFFFFFu;
    if (front >= back) return false;
    if (share.range.compare_exchange_weak(v, (front << 32) | (back - 1), std::memory_order_relaxed)) {
      chunk = static_cast<int64_t>(back - 1);
      return true;
    }
  }
}

}  // namespace detail

// The chunks one thread runs: its own share's from the front, then the others' from their backs.
class Chunks {
 public:
  Chunks(detail::Share* shares, int threads, int self, int64_t begin, int64_t end, int64_t grain)
      : shares_(shares), threads_(threads), self_(self), begin_(begin), end_(end), grain_(grain) {}

  // the next chunk [lo, hi), or false when none is left
  bool next(int64_t& lo, int64_t& hi) {
    int64_t chunk;
    for (; k_ < threads_; ++k_) {
      detail::Share& share = shares_[(self_ + k_) % threads_];
      if (k_ == 0 ? detail::take_front(share, chunk) : detail::take_back(share, chunk)) {
        lo = begin_ + chunk * grain_;
        hi = std::min(end_, lo + grain_);
        return true;
      }
    }
    return false;
  }

 private:
  detail::Share* shares_;
  int threads_, self_, k_ = 0;  // k_: which share is being taken from, counted from the thread's own
  int64_t begin_, end_, grain_;
};

// thread_fn(Chunks&) on each of torch's intra-op threads, which runs the chunks (of `grain` items,
// the last may be shorter) that `next` hands it: for kernels with per-thread set-up (tile
// configuration, buffers) around the chunks. Inline, with every item in one chunk, where one
// thread would do it all or inside a parallel region.
template <typename F>
void parallel_chunks(int64_t begin, int64_t end, int64_t grain, const F& thread_fn) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t chunks = (n + grain - 1) / grain;
  int threads = 1;
#ifdef _OPENMP
  if (!omp_in_parallel()) threads = static_cast<int>(std::min<int64_t>(at::get_num_threads(), chunks));
#endif
  // on the stack for the usual thread counts (a heap allocation per call costs as much as the
  // fork and join of a small kernel)
  constexpr int kStackShares = 16;
  detail::Share stack_shares[kStackShares];
  std::vector<detail::Share> heap_shares(threads > kStackShares ? threads : 0);
  detail::Share* shares = threads > kStackShares ? heap_shares.data() : stack_shares;
  if (threads == 1) {  // one chunk of everything
    shares[0].range.store(1, std::memory_order_relaxed);
    Chunks mine(shares, 1, 0, begin, end, n);
    thread_fn(mine);
    return;
  }
  for (int t = 0; t < threads; ++t)
    shares[t].range.store((static_cast<uint64_t>(chunks * t / threads) << 32) |
                              static_cast<uint64_t>(chunks * (t + 1) / threads),
                          std::memory_order_relaxed);
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
  {
    Chunks mine(shares, threads, omp_get_thread_num(), begin, end, grain);
    thread_fn(mine);
  }
#endif
}

// fn(lo, hi) over [begin, end) in chunks of `grain` items, as parallel_chunks hands them out.
template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& fn) {
  parallel_chunks(begin, end, grain, [&](Chunks& chunks) {
    int64_t lo, hi;
    while (chunks.next(lo, hi)) fn(lo, hi);
  });
}

}  // namespace llm_serve
