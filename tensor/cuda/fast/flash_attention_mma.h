// Internal to tensor/: the tensor-core flash attention forward
// (flash_attention_mma.cu), which ops::flash_attention runs on a GPU for the
// inputs it takes when LOOM_CUDA_KERNELS=fast; everything else runs the
// CUDA-core kernel of flash_attention.cu, the reference. Its outputs are the
// reference's (o like q, lse [B, H, T] float32), so the same backward follows.
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

}  // namespace loom::cuda
