// LayerNorm over the last dim: y = (x - mean) / sqrt(var + eps) * weight + bias,
// the biased variance, eps = 1e-5 as PyTorch. weight = 1, bias = 0 at init.
// The math is one fused per-row kernel (tensor/kernels/layernorm.h).
#pragma once

#include "autograd/functions.h"
#include "nn/module.h"

namespace loom::nn {

struct LayerNorm : Layer {
  Tensor weight, bias;  // [C]
  double eps;

  explicit LayerNorm(int64_t C, double eps = 1e-5) : eps(eps) {
    weight = register_parameter("weight", ones({C}));
    bias = register_parameter("bias", zeros({C}));
  }

  // x: [..., C] -> [..., C]
  Tensor forward(const Tensor& x) override {
    LOOM_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(0), "LayerNorm: input ", x.shape(),
               " does not end in ", weight.size(0), " features");
    return autograd::layer_norm(x, weight, bias, eps);
  }
};

}  // namespace loom::nn
