// Splitting a CPU loop over the math threads, for code outside tensor/ (the
// optimizer's fused AdamW loop; PyTorch's at::parallel_for). It is the split
// the elementwise ops use (tensor/cpu/parallel.h): contiguous chunks of
// [0, n), one per thread (ops::set_num_threads), each starting at a multiple
// of 16, and all of [0, n) on the calling thread when n < 2 * grain.
//
// Only for loops whose iterations write disjoint outputs: each output is then
// computed by the same code whatever the split, so the bits do not depend on
// the thread count. fn must not throw (it runs inside an OpenMP region).
//
// A compiled function rather than the header template, because OpenMP is a
// private dependency of loom_tensor: a library built without -fopenmp would
// silently get the one-thread fallback of cpu/parallel.h's template.
#pragma once

#include <cstdint>
#include <functional>

namespace loom {

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t begin, int64_t end)>& fn);

// n whole tasks split as evenly as they go (cpu/parallel.h's
// parallel_for_tasks, which attention's products use): 48 at 2 threads is
// 24 + 24, where parallel_for's multiples of 16 give 16 + 32.
void parallel_for_tasks(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn);

// While it lives, this host thread runs every loop's chunks (the split
// ops::set_num_threads chose) one after another on itself: one core, and the
// same bits as when the math threads share them. For two host threads that
// compute at once (parallel/pipeline_parallel/overlapped_pairs.h): one core each.
class OneCoreGuard {
 public:
  OneCoreGuard();
  ~OneCoreGuard();
  OneCoreGuard(const OneCoreGuard&) = delete;
  OneCoreGuard& operator=(const OneCoreGuard&) = delete;

 private:
  bool saved_;
};

}  // namespace loom
