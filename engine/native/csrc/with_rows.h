// A run-time row count turned into a compile-time one: the kernels' register tiles take their
// row count as a template argument, so their sums stay in registers and their loops unroll; a
// batch's last, partial tile goes through this to the tile of its own row count.
#pragma once

#include <type_traits>
#include <utility>

namespace llm_serve {

// f(std::integral_constant<int, m>{}) for a row count m in 1..M (m is clamped to that range)
template <int M, typename F>
inline decltype(auto) with_rows(int m, F&& f) {
  static_assert(M >= 1, "a tile has at least one row");
  if constexpr (M > 1) {
    if (m < M) return with_rows<M - 1>(m, std::forward<F>(f));
  }
  return f(std::integral_constant<int, M>{});
}

}  // namespace llm_serve
