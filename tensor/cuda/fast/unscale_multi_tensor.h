// The grad scaler's unscale + found_inf over every grad in one launch (issue 44;
// PyTorch's _amp_foreach_non_finite_check_and_unscale_), and clipping's scale
// the same way. What they do that the reference does not: the reference
// (optim.cu's unscale_kernel, elementwise.cu's mul_) launches once a tensor,
// and unscale_ zeroes its found_inf flag with a memset first: a GPT-2 small's
// ~150 main grads make ~151 launches to unscale and ~150 to clip, each ~3-5 us
// of host time plus a gap on the GPU. Here the grads are reached through the
// chunk table (kernels/tensor_chunks.h; a block a 4096-element chunk) uploaded
// once with the flag zeroed in it, so each is one launch and one ~16-bytes-a-
// chunk upload. The element math is kernels::unscale_and_check with the
// reference's float factor: the same bits as the reference
// (tests/cuda/test_cuda_grad_multi_tensor.cpp).
// found_inf is deterministic: every thread that sees an inf or nan stores the
// same 1 (no atomics, no order to depend on).
#pragma once

#include <vector>

#include "tensor/tensor.h"

namespace loom::cuda {

// grads: contiguous fp32 on one GPU (0-element ones allowed). g *= float(inv_scale)
// for all; returns whether any element was inf or nan before (the host waits
// for the flag: the step is skipped or taken on the host, as in the reference).
bool unscale_multi_tensor(const std::vector<Tensor>& grads, double inv_scale);

// g *= float(factor) for all (clipping's max_norm / (norm + 1e-6)), as ops::mul_
// rounds it; no flag, no wait.
void scale_multi_tensor(const std::vector<Tensor>& grads, double factor);

}  // namespace loom::cuda
