// Gradient clipping by total norm (torch.nn.utils.clip_grad_norm_): treat all
// gradients as one long vector g; if |g| > max_norm, scale every gradient by
// max_norm / (|g| + 1e-6). Keeps one bad batch from throwing the weights far.
#pragma once

#include <vector>

#include "tensor/tensor.h"

namespace loom::optim {

// L2 norm of all the tensors taken together, sqrt(sum_t sum_i t_i^2),
// accumulated in double. Undefined tensors are skipped.
double total_norm(const std::vector<Tensor>& tensors);

// Clips the autograd gradients of params (params without one are skipped) and
// returns the norm before clipping. A non-finite norm is returned as is (and
// the gradients become non-finite, as in PyTorch): the caller decides to skip.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

// The same on explicit gradient tensors, e.g. the fp32 main_grad buffers.
double clip_grads(const std::vector<Tensor>& grads, double max_norm);

// The scaling step alone, given the norm (computed elsewhere, e.g. over several
// ranks): grads *= max_norm / (norm + 1e-6) when that is < 1.
void scale_grads_to_norm(const std::vector<Tensor>& grads, double max_norm, double norm);

}  // namespace loom::optim
