// linear_gelu's epilogue on the CPU: one sweep over the GEMM's output, row by row,
//   h [M, N] = acc + b     (rounded to T, kept for GELU's backward)
//   y [M, N] = gelu(h)     (kernels::gelu, the readable reference)
// where linear then gelu took two (linear's bias pass over all of h, then gelu
// reading h back: the MLP's [B T, 4C] is 2 MB in the small GPT).
// The same two roundings in the same order, so the bits are those of
// gelu(linear(x, w, b)) (tests/test_fast_paths.cpp, LinearGelu). Small GPT at
// AVX2: -0.2 ms a step (bench/README.md, issue 47).
//
// Rows go to threads (the grain as linear's bias pass); each row's loops sit
// alone in a small function so they vectorise like cpu/loops.h's.
#pragma once

#include <algorithm>
#include <cstdint>

#include "tensor/cpu/gelu_vec.h"
#include "tensor/cpu/parallel.h"

namespace loom::cpu {

// One row: h[j] += b[j] (b may be null: no bias), then y[j] = kernels::gelu(h[j]) while
// the row is still in L1 (the two in one loop measured slower: 1.77 against
// 1.60 ms a small step at AVX2).
template <class T>
[[gnu::noinline]] void bias_gelu_row(T* __restrict h, T* __restrict y, const T* __restrict b, int64_t n) {
  if (b)
    for (int64_t j = 0; j < n; ++j) h[j] += b[j];
  gelu_run(h, y, n);  // kernels::gelu on each value (cpu/gelu_vec.h: 4 vectors in flight at AVX2)
}

// h, y: [M, N] row-major contiguous; b: [N] or null. T is float or double
// (bf16 keeps linear then gelu: its bias goes in before the GEMM).
template <class T>
void bias_gelu(T* h, T* y, const T* b, int64_t M, int64_t N) {
  const int64_t row_grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(N, 1));
  parallel_for(M, row_grain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) bias_gelu_row(h + i * N, y + i * N, b, N);
  });
}

}  // namespace loom::cpu
