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

#include <vector>

#include "autograd/hooks.h"
#include "parallel/data_parallel/data_parallel_common.h"

namespace loom::parallel {

class DataParallelNaive : public DataParallel {
 public:
  // Broadcasts the params from dp rank 0 and registers the hooks (collective
  // over dp_group). Params that do not require grad are broadcast but not hooked.
  // experts: params broadcast and averaged over their own group, scaled (ExpertParams, data_parallel_common.h).
  // Destroying it unregisters the hooks (they are owned by hooks_).
  DataParallelNaive(const NamedParams& params, ProcessGroup& dp_group, ExpertParams experts = {});
  DataParallelNaive(const std::vector<Tensor>& params, ProcessGroup& dp_group, ExpertParams experts = {});

  // Drops every param's .grad (the optimizer has consumed it).
  void zero_grad() override;
  // False inside no_sync() (DataParallel's): backward only accumulates .grad locally.
  bool require_backward_grad_sync() const { return require_backward_grad_sync_; }

  ProcessGroup& dp_group() { return dp_group_; }
  const std::vector<Tensor>& params() const { return params_; }

 private:
  void all_reduce_grad(const Tensor& param);  // the post-accumulate hook

  ProcessGroup& dp_group_;
  ExpertParams experts_;
  std::vector<Tensor> params_;
  std::vector<autograd::RemovableHandle> hooks_;  // registered while this wrapper lives
};

}  // namespace loom::parallel
