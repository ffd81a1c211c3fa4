#include "parallel/data_parallel/data_parallel_naive.h"

#include "autograd/accumulate_grad.h"
#include "autograd/variable.h"
#include "parallel/teach/teach_break.h"
#include "tensor/ops.h"

namespace loom::parallel {

DataParallelNaive::DataParallelNaive(const NamedParams& params, ProcessGroup& dp_group, ExpertParams experts)
    : DataParallelNaive(unique_params(params), dp_group, std::move(experts)) {}

DataParallelNaive::DataParallelNaive(const std::vector<Tensor>& params, ProcessGroup& dp_group, ExpertParams experts)
    : dp_group_(dp_group), experts_(std::move(experts)), params_(unique_params(params)) {
  std::vector<Tensor> dense, expert;
  for (const Tensor& p : params_) (experts_.group && experts_.holds(p) ? expert : dense).push_back(p);
  broadcast_params(dense, dp_group_);
  if (experts_.group) broadcast_params(expert, *experts_.group);  // an expert's replicas: its expert-dp group
  for (const Tensor& p : params_) {
    if (!autograd::requires_grad(p)) continue;
    // Runs right after backward has added this step's gradient into p.grad.
    hooks_.push_back(autograd::register_post_accumulate_grad_hook(p, [this](Tensor& g) { all_reduce_grad(g); }));
  }
}

void DataParallelNaive::all_reduce_grad(const Tensor& param) {
  if (!require_backward_grad_sync_) return;  // no_sync: keep the local gradient
  // The gradient - not the parameter (picotron's bug) - summed over the dp
  // ranks and divided by their number: the mean over the global batch.
  if (teach::broken(teach::Break::DpAllReduceParam)) {
    dp_group_.all_reduce(param, ReduceOp::Avg);  // the bug: the params agree, each rank steps its own gradient
    return;
  }
  if (experts_.group && experts_.holds(param)) {  // an expert: over its replicas, then x 1 / ep (ExpertParams)
    ops::mul_(autograd::grad(param), experts_.grad_scale);
    experts_.group->all_reduce(autograd::grad(param), ReduceOp::Avg);
    return;
  }
  dp_group_.all_reduce(autograd::grad(param), ReduceOp::Avg);
}

void DataParallelNaive::zero_grad() { autograd::zero_grad(params_); }

}  // namespace loom::parallel
