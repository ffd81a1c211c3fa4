// Sums (and maxima) over one row for the per-row kernels (softmax, layernorm,
// cross-entropy).
//
// A plain `s += f(i)` loop is one long dependency chain: each add waits for the
// previous one (~4 cycles), and the compiler may not reorder float adds to
// vectorise it. row_sum keeps 16 partial sums (lane k adds terms k, k+16,
// k+32, ...), which the compiler keeps in vector registers, adds them up
// pairwise (lane k + lane k+8, then +4, +2, +1) and then the n % 16 leftover
// terms. The order is fixed by n alone, so results are deterministic (the
// same on 1 or 2 threads); it is also more accurate than one running sum.
#pragma once

#include "tensor/macros.h"

namespace loom::kernels {

constexpr int kRowLanes = 16;

// sum_{i < n} f(i), f(i) of type T.
template <class T, class F>
LOOM_HOST_DEVICE T row_sum(long n, F f) {
  T lane[kRowLanes] = {};
  long i = 0;
  for (; i + kRowLanes <= n; i += kRowLanes)
    for (int k = 0; k < kRowLanes; ++k) lane[k] += f(i + k);
  for (int w = kRowLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) lane[k] += lane[k + w];
  T tail = 0;
  for (; i < n; ++i) tail += f(i);
  return lane[0] + tail;
}

// max_{i < n} x[i] (n >= 1). Max is exact in any order; the lanes only let it vectorise.
template <class T>
LOOM_HOST_DEVICE T row_max(const T* x, long n) {
  T m = x[0];
  long i = 0;
  if (n >= kRowLanes) {
    T lane[kRowLanes];
    for (int k = 0; k < kRowLanes; ++k) lane[k] = x[k];
    for (i = kRowLanes; i + kRowLanes <= n; i += kRowLanes)
      for (int k = 0; k < kRowLanes; ++k) lane[k] = x[i + k] > lane[k] ? x[i + k] : lane[k];
    for (int k = 0; k < kRowLanes; ++k) m = lane[k] > m ? lane[k] : m;
  }
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

}  // namespace loom::kernels
