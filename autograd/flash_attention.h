// Flash attention as a differentiable op: ops::flash_attention forward (o and
// each row's log-sum-exp, no [T, T] matrix), ops::flash_attention_backward
// when the gradient comes back. nn::attend runs it for CUDA tensors when
// LOOM_CUDA_KERNELS=fast (tensor/cuda/kernel_choice.h); it also runs on the
// CPU, the same per-tile math in the kernels' order, which is how it is tested.
#pragma once

#include "autograd/variable.h"
#include "tensor/flash_attention.h"

namespace loom::autograd {

// softmax(causal(scale q kᵀ)) v for q, k, v [B, H, T, hd] (ops::flash_attention_unsupported
// says which inputs it takes) -> [B, H, T, hd], heads merged in memory.
Tensor flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale);

}  // namespace loom::autograd
