// NcclProcessGroup: ProcessGroup on NCCL (process_group_nccl.h says what it is
// and why it orders streams with events): its bootstrap, life cycle and split;
// each operation is in nccl_collectives.cpp. In a build without NCCL only the
// two entry points exist, and they say how to get the backend.
#include "parallel/comm/process_group_nccl.h"

#ifdef LOOM_WITH_NCCL
#include <cstring>

#include "parallel/comm/nccl_process_group.h"
#endif

namespace loom::parallel {

#ifndef LOOM_WITH_NCCL

bool built_with_nccl() { return false; }

std::unique_ptr<ProcessGroup> make_nccl_world(ProcessGroup&, const Device&) {
  throw Error("the NCCL backend is not built (configure with -DLOOM_CUDA=ON where NCCL is installed)");
}

#else

static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0), "loom's NCCL backend needs NCCL 2.18+ (ncclCommSplit)");
static_assert(sizeof(size_t) >= sizeof(int64_t), "NCCL counts are size_t; every tensor's numel must fit");

bool built_with_nccl() { return true; }

namespace nccl_backend {

// ---- bootstrap: the unique id travels over an existing group -----------------------

std::unique_ptr<NcclProcessGroup> NcclProcessGroup::create_world(ProcessGroup& bootstrap, const Device& device,
                                                                 std::string name) {
  // 1. Every rank checks its GPU, and all learn whether every rank can go on,
  //    before any enters a call that would wait forever for a rank that threw.
  std::string problem;
  if (!device.is_cuda()) {
    problem = str("make_nccl_world: ", device.str(), " is not a CUDA device");
  } else if (cuda::device_count() == 0) {
    problem = str("make_nccl_world: no CUDA device on this machine (", cuda::unavailable_reason(), ")");
  } else {
    try {
      cuda::check_device(device);
    } catch (const Error& e) {
      problem = str("make_nccl_world: ", e.what());
    }
  }
  Tensor failed_rank = from_vector<int32_t>({problem.empty() ? -1 : bootstrap.rank()});
  bootstrap.all_reduce(failed_rank, ReduceOp::Max);
  const int failed = failed_rank.item<int32_t>();
  if (failed >= 0)
    throw Error(problem.empty() ? str("make_nccl_world: rank ", failed, " cannot use its GPU (see its error)")
                                : problem);

  // 2. Rank 0 makes the id; the bootstrap group broadcasts its 128 bytes.
  static_assert(sizeof(ncclUniqueId) == 16 * sizeof(int64_t), "ncclUniqueId travels as 16 int64");
  Tensor id = zeros({17}, kInt64);  // [0]: 1 once rank 0 made the id; [1..16]: the id
  if (bootstrap.rank() == 0) {
    try {
      ncclUniqueId made;
      NCCL_CHECK(ncclGetUniqueId(&made));
      std::memcpy(id.data<int64_t>() + 1, &made, sizeof(made));
      id.data<int64_t>()[0] = 1;
    } catch (const Error& e) {
      problem = e.what();
    }
  }
  bootstrap.broadcast(id, 0);
  if (id.data<int64_t>()[0] != 1)
    throw Error(problem.empty() ? "make_nccl_world: rank 0 could not make the NCCL unique id (see its error)"
                                : problem);
  ncclUniqueId unique_id;
  std::memcpy(&unique_id, id.data<int64_t>() + 1, sizeof(unique_id));

  // 3. Every rank joins the communicator on its GPU (NCCL reads the current device).
  ncclComm_t comm = nullptr;
  {
    cuda::DeviceGuard guard(device);
    NCCL_CHECK(ncclCommInitRank(&comm, bootstrap.size(), unique_id, bootstrap.rank()));
  }
  return std::make_unique<NcclProcessGroup>(comm, device, std::move(name));
}

NcclProcessGroup::NcclProcessGroup(ncclComm_t comm, const Device& device, std::string name)
    : device_(device), name_(std::move(name)) {
  comm_->comm = comm;
  try {
    NCCL_CHECK(ncclCommUserRank(comm, &rank_));
    NCCL_CHECK(ncclCommCount(comm, &size_));
    cuda::DeviceGuard guard(device_);
    // Non-blocking: the group's stream does not wait on the legacy default stream.
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    barrier_buffer_ = zeros({1}, kFloat32, device_);
  } catch (...) {
    shutdown();
    throw;
  }
  label_ = str(name_, " (size ", size_, ", NCCL)");
  watchdog::watch(this);
}

// On the watchdog's thread, under its lock, just before the job is aborted:
// NCCL's kernels spin until their peers come, so they are told to stop. Only
// if the group's lock is free (it is held briefly, while launching): the job
// ends either way.
void NcclProcessGroup::abort_communication() const {
  std::unique_lock<std::mutex> lock(comm_->mutex, std::try_to_lock);
  if (!lock.owns_lock() || !comm_->comm) return;
  (void)ncclCommAbort(comm_->comm);
  comm_->comm = nullptr;
  comm_->aborted = true;
}

void NcclProcessGroup::shutdown() noexcept {
  std::lock_guard<std::mutex> lock(comm_->mutex);
  if (!comm_->comm) return;
  std::optional<cuda::DeviceGuard> guard;
  try {
    guard.emplace(device_);
  } catch (...) {  // the CUDA runtime is going away (exit): free what can be freed
  }
  if (async_error(comm_->comm) != ncclSuccess) {
    // Its kernels may never finish: abort them rather than wait for them.
    (void)ncclCommAbort(comm_->comm);
    std::vector<Tensor> buffer{std::move(barrier_buffer_)};
    abandon(buffer);
  } else {
    if (stream_) (void)cudaStreamSynchronize(stream_);
    (void)ncclCommDestroy(comm_->comm);
  }
  comm_->comm = nullptr;
  if (ready_) (void)cudaEventDestroy(ready_);
  if (stream_) (void)cudaStreamDestroy(stream_);
  ready_ = nullptr, stream_ = nullptr;
}

// ncclCommSplit: collective over this group; NCCL_SPLIT_NOCOLOR gives no communicator.
std::unique_ptr<ProcessGroup> NcclProcessGroup::split(int color, int key, const std::string& name) {
  ncclComm_t newcomm = nullptr;
  {
    std::lock_guard<std::mutex> lock(comm_->mutex);
    LOOM_CHECK(comm_->comm, "split: process group ", name_, " has been shut down");
    cuda::DeviceGuard guard(device_);
    NCCL_CHECK(ncclCommSplit(comm_->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &newcomm, nullptr));
  }
  if (!newcomm) return nullptr;
  return std::make_unique<NcclProcessGroup>(newcomm, device_, name);
}

}  // namespace nccl_backend

std::unique_ptr<ProcessGroup> make_nccl_world(ProcessGroup& bootstrap, const Device& device) {
  return nccl_backend::NcclProcessGroup::create_world(bootstrap, device, "world");
}

#endif  // LOOM_WITH_NCCL

}  // namespace loom::parallel
