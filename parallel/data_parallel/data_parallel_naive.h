// DataParallelNaive: the simplest correct data parallelism. Every dp rank runs
// the same model on its own slice of the global batch. As soon as backward has
// accumulated a parameter's gradient, a hook all-reduces that gradient over
// the dp group and divides by the group size, there and then. Every rank ends
// backward holding the mean gradient of the global batch, so the same
// optimizer step keeps the replicas identical.
//
// Why "naive": one small all-reduce per parameter, each blocking backward until
// it is done - nothing overlaps. DataParallelBucket (data_parallel_bucket.h)
// fixes both. picotron's naive wrapper (data_parallel.py) had a bug worth
// remembering: its hook all-reduced the parameter instead of its gradient,
// and the replicas' weights quietly averaged each other instead.
//
//   DataParallelNaive dp(model.named_parameters(), pgm.dp_group());
//   loss = model(x_slice); backward(loss);  // grads now averaged over dp
//   optimizer.step();
#pragma once

#include <memory>

#include "parallel/data_parallel/data_parallel_common.h"

namespace loom::parallel {

class DataParallelNaive : public DataParallel {
 public:
  // Broadcasts the params from dp rank 0 and registers the hooks (collective
  // over dp_group). Params that do not require grad are broadcast but not hooked.
  DataParallelNaive(const NamedParams& params, ProcessGroup& dp_group);
  DataParallelNaive(const std::vector<Tensor>& params, ProcessGroup& dp_group);
  ~DataParallelNaive();  // the hooks stay registered but do nothing afterwards
  DataParallelNaive(const DataParallelNaive&) = delete;
  DataParallelNaive& operator=(const DataParallelNaive&) = delete;

  // Gradient accumulation: backward inside the guard only accumulates .grad locally.
  [[nodiscard]] NoSyncGuard no_sync() override { return NoSyncGuard(state_->require_backward_grad_sync); }
  // Drops every param's .grad (the optimizer has consumed it).
  void zero_grad() override;
  bool require_backward_grad_sync() const { return state_->require_backward_grad_sync; }

  ProcessGroup& dp_group() { return *state_->group; }
  const std::vector<Tensor>& params() const { return params_; }

 private:
  // Shared with the hooks, which outlive this object inside the autograd meta.
  struct State {
    ProcessGroup* group;
    bool require_backward_grad_sync = true;
    bool alive = true;
  };
  std::shared_ptr<State> state_;
  std::vector<Tensor> params_;
};

}  // namespace loom::parallel
