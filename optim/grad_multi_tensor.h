// The grad scaler's and clipping's passes over all the grads - unscale +
// found_inf, the sum of squares of the norm, the clipping scale - in one
// launch each on a GPU with LOOM_CUDA_KERNELS=fast (tensor/cuda/fast/
// unscale_multi_tensor.h, grad_norm_multi_tensor.h), as adamw_updates.h does
// for AdamW. The grads that fit (contiguous fp32 on the first such grad's GPU)
// go together; the rest (CPU, other dtypes or devices; every grad under the
// reference kernels) take the per-tensor ops as before. unscale and the scale
// give the reference's bits; the sum of squares adds in another fixed order
// (float64 rounding apart, tensor/kernels/chunk_sum_of_squares.h).
#pragma once

#include <vector>

#include "tensor/tensor.h"

namespace loom::optim {

struct OneLaunchSplit {
  std::vector<Tensor> together;  // for the one launch (empty unless fast kernels are chosen)
  std::vector<Tensor> rest;      // per-tensor ops; undefined grads are in neither
};
OneLaunchSplit split_for_one_launch(const std::vector<Tensor>& grads);

// ops::unscale_ (g *= inv_scale; whether any was inf or nan before).
bool unscale_grads(const std::vector<Tensor>& grads, double inv_scale);
// ops::sum_of_squares (in double).
double grads_sum_of_squares(const std::vector<Tensor>& grads);
// ops::mul_(g, factor) for each.
void scale_grads(const std::vector<Tensor>& grads, double factor);

}  // namespace loom::optim
