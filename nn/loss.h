// The language-model loss: cross-entropy of next-token logits against targets,
// averaged over the tokens whose target is not ignore_index (PyTorch's
// F.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-100)).
// Fused log-softmax + NLL per row (tensor/kernels/cross_entropy.h).
#pragma once

#include "autograd/functions.h"

namespace loom::nn {

// logits: [B, T, V] (or [N, V]) float, targets: [B, T] (or [N]) int -> loss []
// Half-precision logits are widened to fp32 first, as Megatron does: the loss
// (and, under fp16, loss x scale, ~3e5 > fp16's max 65504) stays fp32.
inline Tensor cross_entropy_loss(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100) {
  LOOM_CHECK(logits.dim() >= 2 && Shape(logits.shape().begin(), logits.shape().end() - 1) == targets.shape(),
             "cross_entropy_loss: logits ", logits.shape(), " and targets ", targets.shape(),
             " do not match (expected [..., V] and [...])");
  const int64_t V = logits.size(-1);
  const Tensor l = logits.dtype() == kFloat64 ? logits : autograd::to(logits, kFloat32);
  return autograd::cross_entropy(autograd::reshape(l, {-1, V}), ops::reshape(targets, {-1}), ignore_index);
}

}  // namespace loom::nn
