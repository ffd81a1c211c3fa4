// ProcessGroupDecorator: a ProcessGroup that forwards every call to another
// one, so that watching a group's traffic is a subclass that overrides only
// what it watches (a count of the bytes each collective moves, the order in
// which a test's collectives are launched) - not a second implementation of
// the group. The decorated group does the communication; it must outlive this.
#pragma once

#include <memory>
#include <string>

#include "parallel/comm/process_group.h"

namespace loom::parallel {

class ProcessGroupDecorator : public ProcessGroup {
 public:
  explicit ProcessGroupDecorator(ProcessGroup& inner) : inner_(inner) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const std::string& name() const override { return inner_.name(); }
  std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override {
    return inner_.all_reduce_async(t, op);
  }
  std::shared_ptr<Work> reduce_scatter_async(const Tensor& output, const Tensor& input, ReduceOp op) override {
    return inner_.reduce_scatter_async(output, input, op);
  }
  std::shared_ptr<Work> all_gather_async(const Tensor& output, const Tensor& input) override {
    return inner_.all_gather_async(output, input);
  }
  std::shared_ptr<Work> broadcast_async(const Tensor& t, int root) override { return inner_.broadcast_async(t, root); }
  std::shared_ptr<Work> send_async(const Tensor& t, int dst, int tag) override { return inner_.send_async(t, dst, tag); }
  std::shared_ptr<Work> recv_async(const Tensor& t, int src, int tag) override { return inner_.recv_async(t, src, tag); }
  std::shared_ptr<Work> isend(const Tensor& t, int dst, int tag) override { return inner_.isend(t, dst, tag); }
  std::shared_ptr<Work> irecv(const Tensor& t, int src, int tag) override { return inner_.irecv(t, src, tag); }
  std::shared_ptr<Work> barrier_async() override { return inner_.barrier_async(); }
  std::shared_ptr<Work> all_to_all_v_async(const Tensor& output, const Tensor& input,
                                           const std::vector<int64_t>& output_splits,
                                           const std::vector<int64_t>& input_splits) override {
    return inner_.all_to_all_v_async(output, input, output_splits, input_splits);
  }
  // The sub-group is the decorated group's own, undecorated.
  std::unique_ptr<ProcessGroup> split(int color, int key, const std::string& name) override {
    return inner_.split(color, key, name);
  }

 protected:
  ProcessGroup& inner_;
};

}  // namespace loom::parallel
