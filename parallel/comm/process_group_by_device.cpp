#include "parallel/comm/process_group_by_device.h"

namespace loom::parallel {

ProcessGroupByDevice::ProcessGroupByDevice(std::unique_ptr<ProcessGroup> host, std::unique_ptr<ProcessGroup> cuda,
                                           std::string name)
    : ProcessGroupByDevice(*host, std::move(cuda), std::move(name)) {
  owned_host_ = std::move(host);
}

ProcessGroupByDevice::ProcessGroupByDevice(ProcessGroup& host, std::unique_ptr<ProcessGroup> cuda, std::string name)
    : host_(&host), cuda_(std::move(cuda)), name_(std::move(name)) {
  LOOM_CHECK(cuda_, "ProcessGroupByDevice '", name_, "': no CUDA backend");
  LOOM_CHECK(host_->rank() == cuda_->rank() && host_->size() == cuda_->size(), "ProcessGroupByDevice '", name_,
             "': the host backend has this process as rank ", host_->rank(), " of ", host_->size(),
             ", the CUDA backend as rank ", cuda_->rank(), " of ", cuda_->size(), "; they must list the same ranks");
}

ProcessGroup& ProcessGroupByDevice::backend(const char* op, const Tensor& t, const Tensor& other) {
  LOOM_CHECK(t.defined(), op, ": tensor is undefined (group ", name_, ")");
  const bool cuda = t.device().is_cuda();
  LOOM_CHECK(!other.defined() || other.device().is_cuda() == cuda, op, ": ", t.describe(), " on ", t.device().str(),
             " and ", other.describe(), " on ", other.device().str(), " are on different backends of group ", name_);
  return cuda ? *cuda_ : *host_;
}

std::shared_ptr<Work> ProcessGroupByDevice::all_reduce_async(const Tensor& t, ReduceOp op) {
  return backend("all_reduce", t).all_reduce_async(t, op);
}

std::shared_ptr<Work> ProcessGroupByDevice::reduce_scatter_async(const Tensor& output, const Tensor& input,
                                                                 ReduceOp op) {
  return backend("reduce_scatter", output, input).reduce_scatter_async(output, input, op);
}

std::shared_ptr<Work> ProcessGroupByDevice::all_gather_async(const Tensor& output, const Tensor& input) {
  return backend("all_gather", output, input).all_gather_async(output, input);
}

std::shared_ptr<Work> ProcessGroupByDevice::broadcast_async(const Tensor& t, int root) {
  return backend("broadcast", t).broadcast_async(t, root);
}

std::shared_ptr<Work> ProcessGroupByDevice::send_async(const Tensor& t, int dst, int tag) {
  return backend("send", t).send_async(t, dst, tag);
}

std::shared_ptr<Work> ProcessGroupByDevice::recv_async(const Tensor& t, int src, int tag) {
  return backend("recv", t).recv_async(t, src, tag);
}

std::shared_ptr<Work> ProcessGroupByDevice::isend(const Tensor& t, int dst, int tag) {
  return backend("send", t).isend(t, dst, tag);
}

std::shared_ptr<Work> ProcessGroupByDevice::irecv(const Tensor& t, int src, int tag) {
  return backend("recv", t).irecv(t, src, tag);
}

std::shared_ptr<Work> ProcessGroupByDevice::all_to_all_v_async(const Tensor& output, const Tensor& input,
                                                               const std::vector<int64_t>& output_splits,
                                                               const std::vector<int64_t>& input_splits) {
  return backend("all_to_all_v", output, input).all_to_all_v_async(output, input, output_splits, input_splits);
}

namespace {

// Done when both are: a barrier on both backends.
class BothWork final : public Work {
 public:
  BothWork(std::shared_ptr<Work> a, std::shared_ptr<Work> b) : a_(std::move(a)), b_(std::move(b)) {}
  void wait() override {
    a_->wait();
    b_->wait();
  }
  bool is_completed() override { return a_->is_completed() && b_->is_completed(); }

 private:
  std::shared_ptr<Work> a_, b_;
};

}  // namespace

std::shared_ptr<Work> ProcessGroupByDevice::barrier_async() {
  return std::make_shared<BothWork>(host_->barrier_async(), cuda_->barrier_async());
}

std::unique_ptr<ProcessGroup> ProcessGroupByDevice::split(int color, int key, const std::string& name) {
  // Both backends split alike (each split is a collective on its own backend).
  std::unique_ptr<ProcessGroup> host = host_->split(color, key, name);
  std::unique_ptr<ProcessGroup> cuda = cuda_->split(color, key, name);
  LOOM_CHECK(!host == !cuda, "ProcessGroupByDevice::split('", name, "'): one backend made the group, the other not");
  if (!host) return nullptr;
  return std::make_unique<ProcessGroupByDevice>(std::move(host), std::move(cuda), name);
}

}  // namespace loom::parallel
