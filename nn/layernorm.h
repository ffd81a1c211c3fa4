// LayerNorm over the last dim: y = (x - mean) / sqrt(var + eps) * weight + bias,
// the biased variance, eps = 1e-5 as PyTorch. weight = 1, bias = 0 at init.
// The math is one fused per-row kernel (tensor/kernels/layernorm.h).
// Llama's RMSNorm (nn/rmsnorm.h) is the same layer without the mean and the
// bias, so it derives from this one and a block holds either as its ln_1.
#pragma once

#include "autograd/functions.h"
#include "nn/module.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::nn {

struct LayerNorm : Layer {
  Tensor weight, bias;  // [C]; no bias for RMSNorm
  double eps;

  explicit LayerNorm(int64_t C, double eps = 1e-5) : LayerNorm(C, eps, /*with_bias=*/true) {}

  // x: [..., C] -> [..., C]
  Tensor forward(const Tensor& x) override {
    LOOM_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(0), "LayerNorm: input ", x.shape(),
               " does not end in ", weight.size(0), " features");
    return autograd::layer_norm(x, weight, bias, eps);
  }

  // A new layer holding copies of this one's parameters (tensor parallelism's
  // replicated norms start from the full model's).
  virtual std::shared_ptr<LayerNorm> copy() const {
    auto out = std::make_shared<LayerNorm>(weight.size(0), eps);
    out->copy_params_from(*this);
    return out;
  }

 protected:
  void copy_params_from(const LayerNorm& other) {
    NoGradGuard no_grad;  // filling fresh parameters, not a step of the graph
    ops::copy_(weight, other.weight);
    if (bias.defined()) ops::copy_(bias, other.bias);
  }

  LayerNorm(int64_t C, double eps, bool with_bias) : eps(eps) {
    weight = register_parameter("weight", ones({C}));
    if (with_bias) bias = register_parameter("bias", zeros({C}));
  }
};

}  // namespace loom::nn
