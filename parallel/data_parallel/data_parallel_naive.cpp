#include "parallel/data_parallel/data_parallel_naive.h"

#include "autograd/accumulate_grad.h"
#include "autograd/variable.h"

namespace loom::parallel {

DataParallelNaive::DataParallelNaive(const NamedParams& params, ProcessGroup& dp_group)
    : DataParallelNaive(unique_params(params), dp_group) {}

DataParallelNaive::DataParallelNaive(const std::vector<Tensor>& params, ProcessGroup& dp_group)
    : state_(std::make_shared<State>(State{&dp_group})), params_(unique_params(params)) {
  broadcast_params(params_, dp_group);
  for (const Tensor& p : params_) {
    if (!autograd::requires_grad(p)) continue;
    // Runs right after backward has added this step's gradient into p.grad.
    autograd::register_post_accumulate_grad_hook(p, [state = state_](Tensor& param) {
      if (!state->alive || !state->require_backward_grad_sync) return;
      // The gradient - not the parameter (picotron's bug) - summed over the dp
      // ranks and divided by their number: the mean over the global batch.
      Tensor g = autograd::grad(param);
      state->group->all_reduce(g, ReduceOp::Avg);
    });
  }
}

DataParallelNaive::~DataParallelNaive() { state_->alive = false; }

void DataParallelNaive::zero_grad() { autograd::zero_grad(params_); }

}  // namespace loom::parallel
