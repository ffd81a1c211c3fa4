// Gradient-norm clipping when the model is split over ranks (pipeline stages;
// later tensor-parallel shards): the norm that decides the clipping is the
// norm of the *whole* model's gradient, so every rank of the model-parallel
// group must compute the same number (Megatron's clip_grad_norm_fp32,
// get_grad_norm_fp32). Each rank sums the squares of its own gradients, the
// partial sums are all-reduced (sum) over the model-parallel group, and every
// rank scales its gradients by the same max_norm / (norm + 1e-6) when that is < 1.
//
// A weight held by two ranks (the tied embedding on the first and last stage,
// shared_weights.h) would be counted twice; its duplicate copy is passed as
// `not_counted` - it is still scaled, so both copies stay identical.
// (optim/clip_grad.h is the single-process version; optim sits above parallel.)
#pragma once

#include <vector>

#include "parallel/process_group.h"

namespace loom::parallel {

// params: this rank's parameters (their autograd .grad is clipped; params
// without a gradient are skipped). Returns the global norm before clipping.
// Collective over model_parallel_group.
double clip_grad_norm_model_parallel(const std::vector<Tensor>& params, double max_norm,
                                     ProcessGroup& model_parallel_group, const std::vector<Tensor>& not_counted = {});

// The norm of gradients spread over ranks: sqrt of the sum over `group` of
// every rank's sum of squares of its `grads` (undefined ones skipped), in
// double. group may be null: this rank alone. Collective over group. Also what
// optim's clipping and mixed-precision optimizer call.
double global_grad_norm(const std::vector<Tensor>& grads, ProcessGroup* group);

// The global norm alone, sqrt of the all-reduced sum of squares. Collective.
double grad_norm_model_parallel(const std::vector<Tensor>& params, ProcessGroup& model_parallel_group,
                                const std::vector<Tensor>& not_counted = {});

}  // namespace loom::parallel
