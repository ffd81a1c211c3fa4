// Internal to tensor/: flash attention on tensor cores, the forward
// (flash_attention_mma.cu) and its backward (flash_attention_mma_backward.cu),
// which ops::flash_attention and its backward run on a GPU for the inputs they
// take when LOOM_CUDA_KERNELS=fast; everything else runs the CUDA-core kernels
// of flash_attention.cu and flash_attention_backward.cu, the reference. The
// outputs are the reference's (o like q, lse [B, H, T] float32; dq, dk, dv
// like q), so either backward takes either forward's o and lse.
#pragma once

#include <string>

#include "tensor/flash_attention.h"

namespace loom::cuda {

// "" when flash_attention_mma takes q, k, v (already checked by
// ops::flash_attention_unsupported), else why not: bfloat16/float16, head
// size 64 or 128, rows starting on 16-byte boundaries (its loads are 16 bytes).
std::string flash_attention_mma_unsupported(const Tensor& q, const Tensor& k, const Tensor& v);

// q, k, v [B, H, T, hd] -> o (stored [B, T, H, hd]), lse [B, H, T] float32.
ops::FlashAttentionResult flash_attention_mma(const Tensor& q, const Tensor& k, const Tensor& v, double scale);

// dq, dk, dv (stored like o) from the gradient of o, for the q, k, v that
// flash_attention_mma takes; grad_o and o may be any views of that shape.
ops::FlashAttentionGrads flash_attention_mma_backward(const Tensor& grad_o, const Tensor& q, const Tensor& k,
                                                      const Tensor& v, const Tensor& o, const Tensor& lse,
                                                      double scale);

}  // namespace loom::cuda
