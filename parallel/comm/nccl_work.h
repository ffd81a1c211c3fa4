// The Work of one NCCL operation (process_group_nccl.cpp launches it): an
// event recorded on the group's stream after the operation. wait() makes
// loom's stream wait for that event (no host wait); the operation's tensors
// stay alive until then, or until the event has completed. If the
// communicator failed (a peer died, the watchdog aborted it), its buffers
// may still be written by NCCL's kernels, so they are never handed back.
//
// Internal to parallel/comm (it includes the NCCL and CUDA headers); only in
// builds with NCCL.
#pragma once

#ifdef LOOM_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"

namespace loom::parallel {

// NCCL_CHECK(ncclAllReduce(...)): llm.c's ncclCheck, throwing a loom::Error
// that names the call, file:line, NCCL's message and its last error's detail.
[[noreturn]] void throw_nccl_error(ncclResult_t r, const char* call, const char* file, int line);
#define NCCL_CHECK(call)                                                                   \
  do {                                                                                     \
    ncclResult_t loom_nccl_r_ = (call);                                                    \
    if (loom_nccl_r_ != ncclSuccess)                                                       \
      ::loom::parallel::throw_nccl_error(loom_nccl_r_, #call, __FILE__, __LINE__);         \
  } while (0)

// A group's communicator, shared with its Works: one lock serialises every
// call into it (a communicator is not thread-safe), and it is null once the
// group is destroyed (whose destructor has drained the group's stream).
struct SharedComm {
  std::mutex mutex;
  ncclComm_t comm = nullptr;
  bool aborted = false;  // comm is null because the watchdog aborted it, not because the group shut down
};

// Buffers of operations whose communicator failed: NCCL may still touch them,
// so they are never given back (a leak, only after an error).
void abandon(std::vector<Tensor>& tensors);

// The error NCCL found while running this communicator's work (a peer that
// died, a network failure), or ncclSuccess. Under the SharedComm's lock.
ncclResult_t async_error(ncclComm_t comm);

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<SharedComm> comm, const Device& device, std::vector<Tensor> tensors, std::string what);
  // Dropped before wait(): the host waits for the operation, so that its
  // tensors' memory cannot be handed to a kernel while NCCL still uses it.
  ~NcclWork() override;
  cudaEvent_t done() const { return done_; }

  // loom's stream waits for the operation (no host wait): what the caller
  // enqueues next reads its result, and may reuse its tensors' memory.
  void wait() override;
  bool is_completed() override;

 private:
  bool comm_failed();
  void check_comm();  // throws NCCL's asynchronous error, or the watchdog's abort

  std::mutex mutex_;
  std::shared_ptr<SharedComm> comm_;
  Device device_;
  cudaEvent_t done_ = nullptr;   // recorded on the group's stream after the operation
  std::vector<Tensor> tensors_;  // alive until the operation is ordered before loom's stream, or finished
  std::string what_;
  bool failed_ = false;
};

}  // namespace loom::parallel
#endif  // LOOM_WITH_NCCL
