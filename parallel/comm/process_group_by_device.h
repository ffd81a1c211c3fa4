// One group, two backends: host tensors go to one (MPI), CUDA tensors to the
// other (NCCL) - torch.distributed's `init_process_group("cpu:gloo,cuda:nccl")`.
// A training step exchanges both kinds: the gradient buckets and ZeRO's
// params live on the GPU, while found_inf, the grad norm's partial sum, the
// loss and the memory report are host scalars. Rather than move every scalar
// to the GPU, each operation goes to the backend of its tensors' device.
//
// Order: each backend keeps its own FIFO order, and every rank issues the
// same operations in the same order, so each backend sees the same sequence
// on every rank - the contract of both. Operations on different backends are
// not ordered with each other (as two torch.distributed groups are not);
// nothing in loom waits on a host collective while a GPU one it depends on is
// in flight without waiting for that one first.
#pragma once

#include <memory>
#include <string>

#include "parallel/comm/process_group.h"

namespace loom::parallel {

class ProcessGroupByDevice final : public ProcessGroup {
 public:
  // The same ranks in the same order in both (checked: rank and size agree).
  ProcessGroupByDevice(std::unique_ptr<ProcessGroup> host, std::unique_ptr<ProcessGroup> cuda, std::string name);
  // Borrows the host group (the MPI world, owned by parallel::init).
  ProcessGroupByDevice(ProcessGroup& host, std::unique_ptr<ProcessGroup> cuda, std::string name);

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::string& name() const override { return name_; }

  std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override;
  std::shared_ptr<Work> reduce_scatter_async(const Tensor& output, const Tensor& input, ReduceOp op) override;
  std::shared_ptr<Work> all_gather_async(const Tensor& output, const Tensor& input) override;
  std::shared_ptr<Work> broadcast_async(const Tensor& t, int root) override;
  std::shared_ptr<Work> send_async(const Tensor& t, int dst, int tag) override;
  std::shared_ptr<Work> recv_async(const Tensor& t, int src, int tag) override;
  std::shared_ptr<Work> isend(const Tensor& t, int dst, int tag) override;
  std::shared_ptr<Work> irecv(const Tensor& t, int src, int tag) override;
  std::shared_ptr<Work> all_to_all_v_async(const Tensor& output, const Tensor& input,
                                           const std::vector<int64_t>& output_splits,
                                           const std::vector<int64_t>& input_splits) override;
  std::shared_ptr<Work> barrier_async() override;  // on both: a barrier means every rank got here
  std::unique_ptr<ProcessGroup> split(int color, int key, const std::string& name) override;

  ProcessGroup& host_backend() { return *host_; }
  ProcessGroup& cuda_backend() { return *cuda_; }

 private:
  // The backend of t's device; output and input of one operation must share it.
  ProcessGroup& backend(const char* op, const Tensor& t, const Tensor& other = Tensor());

  std::unique_ptr<ProcessGroup> owned_host_;
  ProcessGroup* host_;
  std::unique_ptr<ProcessGroup> cuda_;
  std::string name_;
};

}  // namespace loom::parallel
