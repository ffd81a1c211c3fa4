// Sums over one row for the per-row kernels (softmax, layernorm, cross-entropy).
//
// A plain `s += f(i)` loop is one long dependency chain: each add waits for the
// previous one (~4 cycles), and the compiler may not reorder float adds to
// vectorise it. row_sum keeps 16 partial sums (lane k adds terms k, k+16,
// k+32, ...), which the compiler keeps in vector registers, and adds them up
// pairwise at the end. The order is fixed by n alone, so results are
// deterministic; it is also more accurate than one running sum.
#pragma once

#include "tensor/macros.h"

namespace loom::kernels {

// sum_{i < n} f(i), f(i) of type T.
template <class T, class F>
LOOM_HOST_DEVICE T row_sum(long n, F f) {
  constexpr int kLanes = 16;
  T lane[kLanes] = {};
  long i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) lane[k] += f(i + k);
  T tail = 0;
  for (; i < n; ++i) tail += f(i);
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) lane[k] += lane[k + w];
  return lane[0] + tail;
}

// max_{i < n} x[i] (n >= 1). Max is exact in any order; the lanes only let it vectorise.
template <class T>
LOOM_HOST_DEVICE T row_max(const T* x, long n) {
  constexpr int kLanes = 16;
  if (n < kLanes) {
    T m = x[0];
    for (long i = 1; i < n; ++i) m = x[i] > m ? x[i] : m;
    return m;
  }
  T lane[kLanes];
  for (int k = 0; k < kLanes; ++k) lane[k] = x[k];
  long i = kLanes;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) lane[k] = x[i + k] > lane[k] ? x[i + k] : lane[k];
  T m = lane[0];
  for (int k = 1; k < kLanes; ++k) m = lane[k] > m ? lane[k] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

}  // namespace loom::kernels
