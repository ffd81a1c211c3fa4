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

#if !defined(__CUDACC__)
// The pairwise steps (lane k with lane k+8, then +4, +2, +1) on GCC vector
// types, so the 16 lanes stay in one register and each step is one shuffle and
// one op. Written as a loop over the lane array, GCC spills the lanes and does
// 15 scalar steps through the stack; for a 64-value softmax or a 128-value
// layernorm row that was about a quarter of its time. Same steps, same order,
// so the same bits.
//
// The step is a macro, not a function taking the vectors: 8 doubles are 64
// bytes, which a CPU without AVX-512 passes in memory, so a function with such
// an argument has another ABI on each instruction set (GCC and clang warn,
// -Wpsabi, and CI's warnings are errors). Nothing here crosses a call.
enum class LaneOp { kSum, kMax };
#define LOOM_LANE_STEP(a, b) (kOp == LaneOp::kSum ? (a) + (b) : ((b) > (a) ? (b) : (a)))
template <LaneOp kOp, class T>
inline T lane_tree(const T* lane) {
  typedef T V16 __attribute__((vector_size(16 * sizeof(T))));
  typedef T V8 __attribute__((vector_size(8 * sizeof(T))));
  typedef T V4 __attribute__((vector_size(4 * sizeof(T))));
  typedef T V2 __attribute__((vector_size(2 * sizeof(T))));
  V16 v;
  __builtin_memcpy(&v, lane, sizeof v);
  const V8 lo8 = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  const V8 hi8 = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const V8 v8 = LOOM_LANE_STEP(lo8, hi8);
  const V4 lo4 = __builtin_shufflevector(v8, v8, 0, 1, 2, 3), hi4 = __builtin_shufflevector(v8, v8, 4, 5, 6, 7);
  const V4 v4 = LOOM_LANE_STEP(lo4, hi4);
  const V2 lo2 = __builtin_shufflevector(v4, v4, 0, 1), hi2 = __builtin_shufflevector(v4, v4, 2, 3);
  const V2 v2 = LOOM_LANE_STEP(lo2, hi2);
  const T a = v2[0], b = v2[1];
  return LOOM_LANE_STEP(a, b);
}
#undef LOOM_LANE_STEP
#endif

// sum_{i < n} f(i), f(i) of type T.
template <class T, class F>
LOOM_HOST_DEVICE T row_sum(long n, F f) {
  T lane[kRowLanes] = {};
  long i = 0;
  for (; i + kRowLanes <= n; i += kRowLanes)
    for (int k = 0; k < kRowLanes; ++k) lane[k] += f(i + k);
#if !defined(__CUDACC__)
  lane[0] = lane_tree<LaneOp::kSum>(lane);
#else
  for (int w = kRowLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) lane[k] += lane[k + w];
#endif
  T tail = 0;
  for (; i < n; ++i) tail += f(i);
  return lane[0] + tail;
}

// max_{i < n} x[i] (n >= 1). Max is exact in any order; the lanes only let it
// vectorise, and the lanes are combined pairwise as in row_sum (a chain of 16
// dependent maxima would take ~60 cycles).
template <class T>
LOOM_HOST_DEVICE T row_max(const T* x, long n) {
  T m = x[0];
  long i = 0;
  if (n >= kRowLanes) {
    T lane[kRowLanes];
    for (int k = 0; k < kRowLanes; ++k) lane[k] = x[k];
    for (i = kRowLanes; i + kRowLanes <= n; i += kRowLanes)
      for (int k = 0; k < kRowLanes; ++k) lane[k] = x[i + k] > lane[k] ? x[i + k] : lane[k];
#if !defined(__CUDACC__)
    m = lane_tree<LaneOp::kMax>(lane);
#else
    for (int w = kRowLanes / 2; w > 0; w /= 2)
      for (int k = 0; k < w; ++k) lane[k] = lane[k + w] > lane[k] ? lane[k + w] : lane[k];
    m = lane[0];
#endif
  }
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

}  // namespace loom::kernels
