#include "parallel/comm/nccl_work.h"

#ifdef LOOM_WITH_NCCL
#include <utility>

#include "tensor/cuda/check.h"
#include "tensor/cuda/context.h"

namespace loom::parallel {

void abandon(std::vector<Tensor>& tensors) {
  static std::mutex mutex;
  static auto* abandoned = new std::vector<Tensor>;  // never destroyed: no free at exit either
  std::lock_guard<std::mutex> lock(mutex);
  for (Tensor& t : tensors) abandoned->push_back(std::move(t));
  tensors.clear();
}

void throw_nccl_error(ncclResult_t r, const char* call, const char* file, int line) {
  const char* detail = ncclGetLastError(nullptr);
  throw Error(str(call, " failed at ", file, ":", line, ": ", ncclGetErrorString(r),
                  detail && *detail ? str(" (", detail, ")") : std::string()));
}

ncclResult_t async_error(ncclComm_t comm) {
  ncclResult_t async = ncclSuccess;
  if (ncclCommGetAsyncError(comm, &async) != ncclSuccess) return ncclInternalError;
  return async == ncclInProgress ? ncclSuccess : async;  // in progress: only non-blocking communicators
}

NcclWork::NcclWork(std::shared_ptr<SharedComm> comm, const Device& device, std::vector<Tensor> tensors,
                   std::string what)
    : comm_(std::move(comm)), device_(device), tensors_(std::move(tensors)), what_(std::move(what)) {
  cuda::DeviceGuard guard(device_);  // an event belongs to the device current when it is made
  CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
}

NcclWork::~NcclWork() {
  if (!tensors_.empty()) {
    if (failed_ || comm_failed()) abandon(tensors_);
    else (void)cudaEventSynchronize(done_);
  }
  (void)cudaEventDestroy(done_);
}

void NcclWork::wait() {
  std::lock_guard<std::mutex> lock(mutex_);
  check_comm();
  cuda::DeviceGuard guard(device_);
  CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(device_), done_, 0));
  tensors_.clear();
}

bool NcclWork::is_completed() {
  std::lock_guard<std::mutex> lock(mutex_);
  check_comm();
  const cudaError_t e = cuda::query_event(done_);  // not-ready is not left behind as an error
  if (e == cudaErrorNotReady) return false;
  if (e != cudaSuccess) failed_ = true;
  CUDA_CHECK(e);
  tensors_.clear();  // finished on the GPU: the memory is free to reuse
  return true;
}

bool NcclWork::comm_failed() {
  std::lock_guard<std::mutex> lock(comm_->mutex);
  return comm_->aborted || (comm_->comm && async_error(comm_->comm) != ncclSuccess);
}

void NcclWork::check_comm() {
  std::lock_guard<std::mutex> lock(comm_->mutex);
  if (comm_->aborted) {  // its buffers may still be written by the dead kernels: never handed back (abandon)
    failed_ = true;
    throw Error(str(what_, ": the communicator was aborted by the collective watchdog"));
  }
  if (!comm_->comm) return;  // group destroyed: its destructor waited for this operation
  const ncclResult_t r = async_error(comm_->comm);
  if (r == ncclSuccess) return;
  failed_ = true;
  const char* detail = ncclGetLastError(comm_->comm);
  throw Error(str(what_, ": NCCL reported an asynchronous error: ", ncclGetErrorString(r),
                  detail && *detail ? str(" (", detail, ")") : std::string()));
}

}  // namespace loom::parallel
#endif  // LOOM_WITH_NCCL
