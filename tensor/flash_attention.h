// Fused causal attention with flash attention's tiling, as two ops: forward
// saves only O and one log-sum-exp per row (no [T, T] matrix), backward
// rebuilds the attention weights from them. On a GPU the kernels in
// tensor/cuda/fast/ run; on the CPU the same per-tile math runs tile by tile
// in the kernels' order (tensor/ops_flash_attention.cpp), which is how the
// kernels' arithmetic is tested without a GPU. autograd::flash_attention
// (autograd/flash_attention.h) records the pair; nn::attend picks it.
#pragma once

#include <string>

#include "tensor/tensor.h"

namespace loom::ops {

// "" when flash_attention takes these inputs, else why not (nn::attend then
// runs the composition): q, k, v [B, H, T, hd] of one shape, dtype and device,
// hd <= 64 float32/bf16/fp16 (and float64 on the CPU), or 128 bf16/fp16 on a GPU under LOOM_CUDA_KERNELS=fast.
std::string flash_attention_unsupported(const Tensor& q, const Tensor& k, const Tensor& v);

// o = softmax(causal(scale q kᵀ)) v: [B, H, T, hd] like q, stored with heads
// merged ([B, T, H, hd] in memory, so the reshape after it is a view).
// lse [B, H, T]: each row's log-sum-exp of its scaled scores, float32
// (float64 for float64 inputs): all backward needs besides q, k, v, o.
struct FlashAttentionResult { Tensor o, lse; };
FlashAttentionResult flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale);

// dq, dk, dv (stored like o) from the gradient of o. Deterministic: every sum
// runs in a fixed order (no atomics), so the same inputs give the same bits.
struct FlashAttentionGrads { Tensor dq, dk, dv; };
FlashAttentionGrads flash_attention_backward(const Tensor& grad_o, const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& o, const Tensor& lse, double scale);

}  // namespace loom::ops
