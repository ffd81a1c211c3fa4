// NcclInFlight: the collective watchdog's view of one NCCL group's stream
// (watchdog.h). An MPI group runs its operations on a thread, which knows
// when each one starts and ends. An NCCL group runs them on a CUDA stream,
// which the host sees only through events, so each operation gets two:
//
//   group's stream:  wait "ready" (loom's compute) | record "started" | ncclAllReduce | record "finished"
//
// The watchdog times the oldest unfinished operation from the moment it
// first sees "started" complete (within its polling period), so an
// all-reduce queued behind a long stretch of compute does not count as stuck:
// the MPI backend's rule (tests/mpi/watchdog_slow.cpp). PyTorch's NCCL
// watchdog times from the launch instead.
//
// Thread safety: begin()/end() run on the launching thread under the group's
// lock; oldest_running() on the watchdog's thread. One mutex guards the list.
#pragma once

#ifdef LOOM_WITH_NCCL
#include <cuda_runtime.h>

#include <chrono>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "parallel/comm/watchdog.h"
#include "tensor/device.h"

namespace loom::parallel {

class NcclInFlight {
 public:
  explicit NcclInFlight(const Device& device) : device_(device) {}
  ~NcclInFlight();  // destroys the events (the group's stream has been drained)
  NcclInFlight(const NcclInFlight&) = delete;
  NcclInFlight& operator=(const NcclInFlight&) = delete;

  // Around one launch on the group's stream s: begin() records "started"
  // (after the stream's wait for loom's compute), end() records "finished"
  // (after the NCCL call, or after a launch that threw).
  void begin(cudaStream_t s, std::string op, size_t bytes);
  void end(cudaStream_t s);

  // The oldest operation that has started and not finished, with the
  // seconds since it was first seen started. Drops the finished ones.
  std::optional<watchdog::Running> oldest_running();

 private:
  using Clock = std::chrono::steady_clock;
  struct Op {
    std::string op;
    uint64_t seq = 0;
    size_t bytes = 0;
    cudaEvent_t started = nullptr, finished = nullptr;  // finished: null until end()
    std::optional<Clock::time_point> seen_started;
  };
  cudaEvent_t take_event();      // a spare one, or a new one
  void retire_finished();        // under mutex_: recycles the events of finished operations
  bool done(cudaEvent_t e) const;  // the event has completed (or failed: nothing left to wait for)

  Device device_;
  std::mutex mutex_;
  std::deque<Op> ops_;               // in launch order
  std::vector<cudaEvent_t> spare_;
  uint64_t next_seq_ = 1;
};

}  // namespace loom::parallel
#endif  // LOOM_WITH_NCCL
