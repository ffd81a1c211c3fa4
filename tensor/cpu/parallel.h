// Internal to tensor/: splitting a CPU loop over the math threads (OpenMP).
//
// parallel_for(n, grain, fn) calls fn(begin, end) on contiguous chunks that
// cover [0, n), one chunk per thread, or fn(0, n) on the calling thread when
// n < 2 * grain (too little work to pay for waking a thread) or when only one
// thread is allowed (ops::set_num_threads(1)). Chunks start at multiples of
// 16 so vector loops see the same alignment whatever the split.
// parallel_for_tasks(n, fn) splits n whole tasks (attention's or a batched
// matmul's products, one per batch and head) as evenly as they go: at 2
// threads B * H = 48 products split 24 + 24, where multiples of 16 gave
// 16 + 32 and the step waited for the thread with twice the work. While other
// programs hold the cores the threads would need, the calling thread runs
// the same chunks one after another (cpu/core_watch.h): the split, and so
// every number, stays the one --threads chose.
//
// Determinism: only loops whose iterations write disjoint outputs use this
// (elementwise ops, rows of a softmax, columns of a bias gradient). Each output
// is then computed by the same code in the same order whatever the thread
// count, so results are bit-identical at 1 and 2 threads. Reductions across
// chunks are never split. (GEMMs split C the same way, but their bits are
// the GEMM library's: see gemm.h.)
//
// fn must not throw: an exception cannot leave an OpenMP region.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "tensor/cpu/core_watch.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace loom::cpu {

// Below this many elements of simple elementwise math, one thread is faster.
constexpr int64_t kElementwiseGrain = 32768;

// The thread count set by ops::set_num_threads, for every thread of the
// process (OpenMP's own setting is per thread: a communication thread would
// not see the main thread's). 0: OpenMP's default (OMP_NUM_THREADS or the cores).
inline std::atomic<int>& thread_setting() {
  static std::atomic<int> n{0};
  return n;
}

// Set on a host thread that computes beside another (OneCoreGuard in tensor/parallel.h,
// DualPipeV's overlapped pairs): its loops keep --threads' chunks but run
// them one after another, as when the cores are taken (core_watch.h).
inline thread_local bool t_one_core = false;

// How many threads parallel_for may use here (1 inside a parallel region).
inline int max_threads() {
#ifdef _OPENMP
  if (omp_in_parallel()) return 1;
  const int n = thread_setting().load(std::memory_order_relaxed);
  return n > 0 ? n : omp_get_max_threads();
#else
  return 1;
#endif
}

// Chunks of [0, n) whose inner edges are multiples of `align`.
template <class F>
void parallel_chunks(int64_t n, [[maybe_unused]] int64_t grain, [[maybe_unused]] int64_t align,
                     const F& fn) {  // grain, align: unused without OpenMP
#ifdef _OPENMP
  const int threads = max_threads();
  if (threads > 1 && n >= 2 * std::max<int64_t>(grain, 1)) {
    const int64_t chunks = std::min<int64_t>(threads, n / std::max<int64_t>(grain, 1));
    // Chunk t of nt: [edge(t), edge(t + 1)).
    auto edge = [n, align](int64_t k, int64_t nt) { return k == nt ? n : std::min(n, (n * k / nt) / align * align); };
    if (t_one_core || !wake_math_threads(int(chunks))) {  // one core, or the cores are taken: the same chunks, in turn
      for (int64_t t = 0; t < chunks; ++t)
        if (edge(t, chunks) < edge(t + 1, chunks)) fn(edge(t, chunks), edge(t + 1, chunks));
      return;
    }
#pragma omp parallel num_threads(int(chunks))
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      const int64_t begin = edge(t, nt), end = edge(t + 1, nt);
      if (begin < end) fn(begin, end);
    }
    return;
  }
#endif
  if (n > 0) fn(int64_t(0), n);
}

// Elements of vector loops: chunks start at multiples of 16.
template <class F>
void parallel_for(int64_t n, int64_t grain, const F& fn) {
  parallel_chunks(n, grain, 16, fn);
}

// Whole tasks (products), at least one per chunk: as even as n allows.
template <class F>
void parallel_for_tasks(int64_t n, const F& fn) {
  parallel_chunks(n, 1, 1, fn);
}

}  // namespace loom::cpu
