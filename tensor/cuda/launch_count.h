// Counts the work loom puts on a GPU stream, so that a step's launch count is
// a number a reader can see (train_gpt --trace) and a test can predict. Each
// of these counts one:
//   - a kernel launch (CUDA_CHECK_LAUNCH in check.h follows every `<<<...>>>`,
//     so the count is taken there, in one place);
//   - a cuBLAS call (gemm.cpp, next to its cublas*Ex call);
//   - a cudaMemsetAsync of zero_ and a device-to-device cudaMemcpyAsync of
//     copy_ (copy.cu): the GPU runs them as kernels too.
// Not counted: host <-> device transfers (transfer.cpp, pinned.cpp), the
// one-time zeroing of a device's bad-index slot (context.cpp) and NCCL's own
// kernels (parallel/comm/). A launch costs the host ~3-5 us and the GPU a gap
// between kernels whatever the kernel does, which is why fewer, larger
// launches (one AdamW over every param, fused epilogues) are faster.
//
// Plain C++ in every build (a build without CUDA counts nothing: its count
// stays 0). The counter is one process-wide atomic: loom launches from the
// compute thread and, with the MPI backend, from its communication thread.
#pragma once

#include <atomic>
#include <cstdint>

namespace loom::cuda {

namespace detail {
extern std::atomic<int64_t> g_launches;
}

// Called where a launch happens (check.h, gemm.cpp, copy.cu); n launches at once.
inline void count_launch(int64_t n = 1) { detail::g_launches.fetch_add(n, std::memory_order_relaxed); }

// Launches since the process started.
inline int64_t launches() { return detail::g_launches.load(std::memory_order_relaxed); }

// The launches between its construction (or the last restart()) and now: a
// step's count is the window's count() at its end.
class LaunchWindow {
 public:
  LaunchWindow() : start_(launches()) {}
  int64_t count() const { return launches() - start_; }
  // The count so far, and a new window from now (one step's count, then the next's).
  int64_t restart() {
    const int64_t now = launches();
    const int64_t n = now - start_;
    start_ = now;
    return n;
  }

 private:
  int64_t start_;
};

}  // namespace loom::cuda
