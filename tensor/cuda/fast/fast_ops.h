// The fast CUDA row kernels' entry points (tensor/cuda/fast/*.cu), called by
// the reference entry points in rows.cu and embedding.cu when
// LOOM_CUDA_KERNELS=fast (kernel_choice.h) and the compute dtype is fp32
// (float64 stays on the reference kernels: it exists for gradient checks).
// Called after the reference entry point's checks; same arguments, same
// results up to the order of their sums.
#pragma once

#include "tensor/cuda/kernel_choice.h"
#include "tensor/ops.h"

namespace loom::cuda::fast {

// (Anything else - float64, or an integer tensor the reference refuses - takes the reference path.)
inline bool use_fast(const Tensor& x) { return fast_kernels() && is_floating(x.dtype()) && x.dtype() != kFloat64; }

// softmax_fast.cu: one row per warp (per block past 1024 values), online max/sum.
Tensor softmax(const Tensor& x);
Tensor log_softmax(const Tensor& x);
Tensor causal_softmax(const Tensor& x, double scale);
Tensor softmax_backward(const Tensor& grad, const Tensor& y);
Tensor log_softmax_backward(const Tensor& grad, const Tensor& y);
Tensor causal_softmax_backward(const Tensor& grad, const Tensor& y, double scale);

// layernorm_fast.cu: a warp per row; dw/db in two deterministic passes.
ops::LayerNormResult layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
ops::LayerNormGrads layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                        const Tensor& rstd);

// cross_entropy_fast.cu: a block per row of a vocabulary. The forward fills
// each row's lse [N] (fp32), loss and counted [N] (fp64); the caller
// (embedding.cu's cross_entropy) takes the mean, as after its own kernel.
void cross_entropy_rows(const Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& lse, Tensor& loss,
                        Tensor& counted);
Tensor cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              int64_t count, int64_t ignore_index);

// embedding_backward_fast.cu: a thread per (column, slice of the vocabulary), tokens in order.
Tensor embedding_backward(const Tensor& grad, const Tensor& idx, int64_t num_rows);

}  // namespace loom::cuda::fast
