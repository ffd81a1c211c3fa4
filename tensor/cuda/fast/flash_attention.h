// Internal to tensor/: the CUDA entry points of ops::flash_attention and its
// backward (tensor/flash_attention.h checks the inputs, then calls these for
// CUDA tensors). Kernels: flash_attention.cu (forward) and
// flash_attention_backward.cu; their shared device helpers: flash_tiles.cuh.
#pragma once

#include "tensor/flash_attention.h"

namespace loom::cuda {

// q, k, v [B, H, T, hd] on one GPU, float32/bf16/fp16, last dim contiguous, hd <= 64.
ops::FlashAttentionResult flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale);
ops::FlashAttentionGrads flash_attention_backward(const Tensor& grad_o, const Tensor& q, const Tensor& k,
                                                  const Tensor& v, const Tensor& o, const Tensor& lse, double scale);

}  // namespace loom::cuda
