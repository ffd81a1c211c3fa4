#include "parallel/comm/nccl_in_flight.h"

#ifdef LOOM_WITH_NCCL
#include <utility>

#include "tensor/cuda/check.h"
#include "tensor/cuda/context.h"

namespace loom::parallel {

NcclInFlight::~NcclInFlight() {
  for (Op& o : ops_) {
    if (o.started) (void)cudaEventDestroy(o.started);
    if (o.finished) (void)cudaEventDestroy(o.finished);
  }
  for (cudaEvent_t e : spare_) (void)cudaEventDestroy(e);
}

cudaEvent_t NcclInFlight::take_event() {
  if (!spare_.empty()) {
    cudaEvent_t e = spare_.back();
    spare_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  cuda::DeviceGuard guard(device_);  // an event belongs to the device current when it is made
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

bool NcclInFlight::done(cudaEvent_t e) const {
  const cudaError_t r = cuda::query_event(e);  // not-ready is not left behind as an error
  if (r == cudaErrorNotReady) return false;
  if (r != cudaSuccess) (void)cudaGetLastError();  // a failed stream: the group's Works report it
  return true;
}

void NcclInFlight::retire_finished() {
  while (!ops_.empty() && ops_.front().finished && done(ops_.front().finished)) {
    spare_.push_back(ops_.front().started);
    spare_.push_back(ops_.front().finished);
    ops_.pop_front();
  }
}

void NcclInFlight::begin(cudaStream_t s, std::string op, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  retire_finished();  // keeps the list short when no watchdog runs
  Op o;
  o.op = std::move(op), o.seq = next_seq_++, o.bytes = bytes;
  o.started = take_event();
  const cudaError_t r = cudaEventRecord(o.started, s);
  if (r != cudaSuccess) spare_.push_back(o.started);
  CUDA_CHECK(r);
  ops_.push_back(std::move(o));
}

void NcclInFlight::end(cudaStream_t s) {
  std::lock_guard<std::mutex> lock(mutex_);
  cudaEvent_t e = nullptr;
  try {
    e = take_event();
    CUDA_CHECK(cudaEventRecord(e, s));
  } catch (...) {  // no "finished" to wait for: forget the operation rather than call it stuck
    if (e) spare_.push_back(e);
    spare_.push_back(ops_.back().started);
    ops_.pop_back();
    throw;
  }
  ops_.back().finished = e;
}

std::optional<watchdog::Running> NcclInFlight::oldest_running() {
  std::lock_guard<std::mutex> lock(mutex_);
  retire_finished();
  if (ops_.empty()) return std::nullopt;
  Op& o = ops_.front();
  if (!o.seen_started) {
    if (!done(o.started)) return std::nullopt;  // still behind loom's compute: not running yet
    o.seen_started = Clock::now();
  }
  const double s = std::chrono::duration<double>(Clock::now() - *o.seen_started).count();
  return watchdog::Running{o.op, o.seq, o.bytes, s};
}

}  // namespace loom::parallel
#endif  // LOOM_WITH_NCCL
