// Gradient clipping by total norm (torch.nn.utils.clip_grad_norm_): treat all
// gradients as one long vector g; if |g| > max_norm, scale every gradient by
// max_norm / (|g| + 1e-6). Keeps one bad batch from throwing the weights far.
//
// When the model is split over ranks (pipeline stages, tensor-parallel shards)
// the norm that decides the clipping is the norm of the *whole* model's
// gradient, so every rank of the model-parallel group must compute the same
// number (Megatron's clip_grad_norm_fp32 / get_grad_norm_fp32): each rank sums
// the squares of its own gradients, the partial sums are all-reduced (sum) over
// the group, and every rank scales by the same factor. A weight held by two
// ranks (the tied embedding on the first and last stage) would be counted
// twice; its duplicate copy is passed as `not_counted` - still scaled, so both
// copies stay identical.
#pragma once

#include <vector>

#include "parallel/comm/process_group.h"

namespace loom::optim {

// The norm of gradients spread over ranks: sqrt of the sum over `group` of
// every rank's sum of squares of its `grads` (undefined ones skipped), in
// double. group may be null: this rank alone. Collective over group.
double global_grad_norm(const std::vector<Tensor>& grads, parallel::ProcessGroup* group);

// The scaling step alone, given the norm (computed elsewhere, e.g. over several
// ranks): grads *= max_norm / (norm + 1e-6) when that is < 1.
void scale_grads_to_norm(const std::vector<Tensor>& grads, double max_norm, double norm);

// Clips the autograd gradients of params (params without one are skipped; a
// param listed twice counts once) and returns the norm before clipping: the
// norm over `group` (null: this rank alone), the duplicates in `not_counted`
// left out of it but scaled too. A non-finite norm is returned as is (and the
// gradients become non-finite, as in PyTorch): the caller decides to skip.
// Collective over group.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, parallel::ProcessGroup* group = nullptr,
                      const std::vector<Tensor>& not_counted = {});

}  // namespace loom::optim
