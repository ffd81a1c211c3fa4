// NcclProcessGroup, the class behind make_nccl_world (process_group_nccl.h says
// what it is and why it orders streams with events). Internal to the NCCL
// backend: included only by its two sources, in a build with NCCL -
// process_group_nccl.cpp (bootstrap, life cycle, split) and nccl_collectives.cpp
// (each operation: checked on the caller's thread, launched on the group's stream).
#pragma once

#ifdef LOOM_WITH_NCCL
#include <nccl.h>

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

namespace loom::parallel::nccl_backend {

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
  // One grouped send/recv per peer (ncclGroupStart/End): NCCL has no all-to-all-v.
  std::shared_ptr<Work> all_to_all_v_async(const Tensor& output, const Tensor& input,
                                           const std::vector<int64_t>& output_splits,
                                           const std::vector<int64_t>& input_splits) override;
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

}  // namespace loom::parallel::nccl_backend

#endif  // LOOM_WITH_NCCL
