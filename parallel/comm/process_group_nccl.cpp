// NcclProcessGroup: ProcessGroup on NCCL (process_group_nccl.h says what it is
// and why it orders streams with events). In a build without NCCL only the two
// entry points exist, and they say how to get the backend.
#include "parallel/comm/process_group_nccl.h"

#ifdef LOOM_WITH_NCCL
#include <nccl.h>

#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "parallel/comm/nccl_in_flight.h"
#include "parallel/comm/nccl_work.h"
#include "parallel/comm/watchdog.h"
#include "parallel/trace/trace.h"
#include "tensor/cuda/check.h"
#include "tensor/cuda/context.h"
#include "tensor/cuda/cuda.h"
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

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::Float64: return ncclFloat64;
    case DType::Float32: return ncclFloat32;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Float16: return ncclFloat16;
    case DType::Int32: return ncclInt32;
    case DType::Int64: return ncclInt64;
  }
  throw Error("nccl_type: unknown dtype");
}

// Avg is NCCL's own (a sum divided by the group size, NCCL 2.10+).
ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
  }
  throw Error("nccl_op: unknown reduce op");
}

class NcclProcessGroup final : public ProcessGroup, public watchdog::Watched {
 public:
  static std::unique_ptr<NcclProcessGroup> create_world(ProcessGroup& bootstrap, const Device& device,
                                                        std::string name);
  // Takes ownership of comm (an initialised communicator for device).
  NcclProcessGroup(ncclComm_t comm, const Device& device, std::string name);
  ~NcclProcessGroup() override {
    shutdown();  // still watched while it drains the stream
    watchdog::unwatch(this);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override;
  std::shared_ptr<Work> reduce_scatter_async(const Tensor& output, const Tensor& input, ReduceOp op) override;
  std::shared_ptr<Work> all_gather_async(const Tensor& output, const Tensor& input) override;
  std::shared_ptr<Work> broadcast_async(const Tensor& t, int root) override;
  // NCCL matches point-to-point transfers between two ranks by the order of
  // their calls, not by tag; tags are only checked (0..32767, as MPI's). The
  // base class's isend/irecv are these: they are already asynchronous.
  std::shared_ptr<Work> send_async(const Tensor& t, int dst, int tag) override;
  std::shared_ptr<Work> recv_async(const Tensor& t, int src, int tag) override;
  // An all-reduce of one float: orders the ranks' streams, not their hosts.
  std::shared_ptr<Work> barrier_async() override;
  std::unique_ptr<ProcessGroup> split(int color, int key, const std::string& name) override;

  // Drains the group's stream and destroys the communicator (aborts it after
  // an asynchronous error). Like MPI_Comm_free, every rank should do it.
  void shutdown() noexcept;

  // For the collective watchdog: the oldest operation running on the stream,
  // and ncclCommAbort when it has been stuck too long.
  std::optional<watchdog::Running> running() const override { return in_flight_.oldest_running(); }
  const std::string& label() const override { return label_; }
  void abort_communication() const override;

 private:
  void check_tensor(const char* op, const Tensor& t, const char* what) const;
  void check_peer(const char* op, int peer, int tag) const;
  template <class Launch>
  std::shared_ptr<Work> enqueue(const std::string& what, size_t bytes, std::vector<Tensor> tensors,
                                const Launch& launch);

  std::shared_ptr<SharedComm> comm_ = std::make_shared<SharedComm>();
  Device device_;
  int rank_ = 0, size_ = 1;
  std::string name_;
  cudaStream_t stream_ = nullptr;  // the group's own stream on device_
  cudaEvent_t ready_ = nullptr;    // recorded on loom's stream before each operation
  Tensor barrier_buffer_;          // [1] float32, all zeros (a sum of zeros stays zero)
  std::string label_;              // "world (size 4, NCCL)", for the watchdog
  mutable NcclInFlight in_flight_{device_};  // the watchdog's view of stream_
};

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

// ---- one operation: checked on the caller's thread, launched on the group's stream ----

void NcclProcessGroup::check_tensor(const char* op, const Tensor& t, const char* what) const {
  LOOM_CHECK(t.defined(), op, ": ", what, " is undefined");
  LOOM_CHECK(t.device() == device_, op, ": the NCCL backend takes CUDA tensors on ", device_.str(), ", got ", what,
             " ", t.describe(), " on ", t.device().str(), " (group ", name_, ")");
  LOOM_CHECK(t.is_contiguous(), op, ": ", what, " ", t.describe(), " must be contiguous (call contiguous() first)");
}

void NcclProcessGroup::check_peer(const char* op, int peer, int tag) const {
  LOOM_CHECK(peer >= 0 && peer < size_, op, ": rank ", peer, " is not in group ", name_, " (size ", size_, ")");
  LOOM_CHECK(peer != rank_, op, ": rank ", rank_, " cannot ", op, " to/from itself (NCCL would wait for the matching "
             "call, which can only come after this one)");
  LOOM_CHECK(tag >= 0 && tag <= 32767, op, ": tag ", tag, " is outside 0..32767");
}

// launch(comm, stream) makes the NCCL call(s). Before it, the group's stream
// waits for everything enqueued so far on loom's stream (the producer of the
// tensors, e.g. main_grad += grad): an event, not a host wait. After it, the
// Work's event marks the operation's end for Work::wait().
template <class Launch>
std::shared_ptr<Work> NcclProcessGroup::enqueue(const std::string& what, size_t bytes, std::vector<Tensor> tensors,
                                                const Launch& launch) {
  const std::string label = str(what, " on group ", name_);  // in errors and in the trace
  // Made before the lock: dropped on an error, its destructor takes the lock.
  auto work = std::make_shared<NcclWork>(comm_, device_, std::move(tensors), label);
  std::lock_guard<std::mutex> lock(comm_->mutex);
  LOOM_CHECK(comm_->comm, what, ": process group ", name_,
             comm_->aborted ? " was aborted by the collective watchdog" : " has been shut down");
  cuda::DeviceGuard guard(device_);
  CUDA_CHECK(cudaEventRecord(ready_, cuda::stream(device_)));
  CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  in_flight_.begin(stream_, what, bytes);
  trace::GpuSpan traced(label, trace::kGpuComm, device_, stream_);  // --trace on a GPU: the GPU communication track
  try {
    launch(comm_->comm, stream_);
  } catch (...) {
    (void)cudaEventRecord(work->done(), stream_);  // the Work's destructor waits for whatever was enqueued
    try {
      in_flight_.end(stream_);
    } catch (...) {  // the launch's error is the one to report
    }
    throw;
  }
  in_flight_.end(stream_);
  CUDA_CHECK(cudaEventRecord(work->done(), stream_));
  return work;
}

std::shared_ptr<Work> NcclProcessGroup::all_reduce_async(const Tensor& t, ReduceOp op) {
  check_tensor("all_reduce", t, "tensor");
  check_reduce_op("all_reduce", t, op);
  return enqueue(str("all_reduce(", reduce_op_name(op), ", ", dtype_name(t.dtype()), ")"), t.nbytes(), {t},
                 [&](ncclComm_t comm, cudaStream_t s) {
    if (t.numel() == 0) return;
    NCCL_CHECK(ncclAllReduce(t.raw_data(), t.raw_data(), size_t(t.numel()), nccl_type(t.dtype()), nccl_op(op),
                             comm, s));
  });
}

// input: [size * n] -> output: [n]. In place when output is this rank's block
// of input (ZeRO's shard of its bucket); any other overlap goes through a
// separate result buffer, copied into output on the group's stream.
std::shared_ptr<Work> NcclProcessGroup::reduce_scatter_async(const Tensor& output, const Tensor& input, ReduceOp op) {
  check_tensor("reduce_scatter", output, "output");
  check_tensor("reduce_scatter", input, "input");
  check_reduce_op("reduce_scatter", input, op);
  check_reduce_scatter_shapes(output, input, size_);
  const void* own_block = static_cast<const char*>(input.raw_data()) + size_t(rank_) * output.nbytes();
  const bool in_place = output.raw_data() == own_block;
  Tensor result = in_place || !overlap(output, input) ? output : empty(output.shape(), output.dtype(), device_);
  return enqueue(str("reduce_scatter(", reduce_op_name(op), ", ", dtype_name(input.dtype()), ")"), input.nbytes(),
                 {output, input, result}, [&](ncclComm_t comm, cudaStream_t s) {
    if (output.numel() == 0) return;
    NCCL_CHECK(ncclReduceScatter(input.raw_data(), result.raw_data(), size_t(output.numel()),
                                 nccl_type(input.dtype()), nccl_op(op), comm, s));
    if (!result.is_same(output))
      CUDA_CHECK(cudaMemcpyAsync(output.raw_data(), result.raw_data(), output.nbytes(), cudaMemcpyDeviceToDevice, s));
  });
}

// input: [n] -> output: [size * n]. In place when input is this rank's block
// of output (ZeRO's param buffer); any other overlap first copies input aside.
std::shared_ptr<Work> NcclProcessGroup::all_gather_async(const Tensor& output, const Tensor& input) {
  check_tensor("all_gather", output, "output");
  check_tensor("all_gather", input, "input");
  check_all_gather_shapes(output, input, size_);
  const void* own_block = static_cast<const char*>(output.raw_data()) + size_t(rank_) * input.nbytes();
  const bool in_place = input.raw_data() == own_block;
  Tensor source = in_place || !overlap(output, input) ? input : empty(input.shape(), input.dtype(), device_);
  return enqueue(str("all_gather(", dtype_name(input.dtype()), ")"), output.nbytes(), {output, input, source},
                 [&](ncclComm_t comm, cudaStream_t s) {
    if (input.numel() == 0) return;
    if (!source.is_same(input))
      CUDA_CHECK(cudaMemcpyAsync(source.raw_data(), input.raw_data(), input.nbytes(), cudaMemcpyDeviceToDevice, s));
    NCCL_CHECK(ncclAllGather(source.raw_data(), output.raw_data(), size_t(input.numel()), nccl_type(input.dtype()),
                             comm, s));
  });
}

std::shared_ptr<Work> NcclProcessGroup::broadcast_async(const Tensor& t, int root) {
  check_tensor("broadcast", t, "tensor");
  LOOM_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of group ", name_, " (size ", size_,
             ")");
  return enqueue(str("broadcast(root ", root, ", ", dtype_name(t.dtype()), ")"), t.nbytes(), {t},
                 [&](ncclComm_t comm, cudaStream_t s) {
    if (t.numel() == 0) return;
    NCCL_CHECK(ncclBroadcast(t.raw_data(), t.raw_data(), size_t(t.numel()), nccl_type(t.dtype()), root, comm, s));
  });
}

std::shared_ptr<Work> NcclProcessGroup::send_async(const Tensor& t, int dst, int tag) {
  check_tensor("send", t, "tensor");
  check_peer("send", dst, tag);
  return enqueue(str("send(to ", dst, ", tag ", tag, ")"), t.nbytes(), {t}, [&](ncclComm_t comm, cudaStream_t s) {
    if (t.numel() == 0) return;
    NCCL_CHECK(ncclSend(t.raw_data(), size_t(t.numel()), nccl_type(t.dtype()), dst, comm, s));
  });
}

std::shared_ptr<Work> NcclProcessGroup::recv_async(const Tensor& t, int src, int tag) {
  check_tensor("recv", t, "tensor");
  check_peer("recv", src, tag);
  return enqueue(str("recv(from ", src, ", tag ", tag, ")"), t.nbytes(), {t}, [&](ncclComm_t comm, cudaStream_t s) {
    if (t.numel() == 0) return;
    NCCL_CHECK(ncclRecv(t.raw_data(), size_t(t.numel()), nccl_type(t.dtype()), src, comm, s));
  });
}

std::shared_ptr<Work> NcclProcessGroup::barrier_async() {
  return enqueue("barrier", 0, {barrier_buffer_}, [&](ncclComm_t comm, cudaStream_t s) {
    NCCL_CHECK(ncclAllReduce(barrier_buffer_.raw_data(), barrier_buffer_.raw_data(), 1, ncclFloat32, ncclSum, comm, s));
  });
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

}  // namespace

std::unique_ptr<ProcessGroup> make_nccl_world(ProcessGroup& bootstrap, const Device& device) {
  return NcclProcessGroup::create_world(bootstrap, device, "world");
}

#endif  // LOOM_WITH_NCCL

}  // namespace loom::parallel
