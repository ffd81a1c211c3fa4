// Linear: y = x @ weightᵀ + bias, with PyTorch's layout (weight [out, in]) so
// that checkpoints map one to one. Initialised as GPT-2: weight ~ N(0, std),
// bias = 0 (not PyTorch's default Kaiming-uniform).
#pragma once

#include "autograd/functions.h"
#include "nn/module.h"
#include "tensor/generator.h"

namespace loom::nn {

struct Linear : Layer {
  Tensor weight;  // [out, in]
  Tensor bias;    // [out], undefined when built without bias

  Linear(int64_t in_features, int64_t out_features, Generator& gen, double init_std = 0.02, bool use_bias = true) {
    weight = register_parameter("weight", randn({out_features, in_features}, gen, kFloat32, 0.0, init_std));
    if (use_bias) bias = register_parameter("bias", zeros({out_features}));
  }

  // x: [..., in] -> [..., out]
  Tensor forward(const Tensor& x) override {
    LOOM_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "Linear: input ", x.shape(), " does not end in ",
               weight.size(1), " features (weight ", weight.shape(), ")");
    // One fused op, x @ weightᵀ + bias (tensor/ops_linear.cpp): the GEMM reads
    // the weight transposed in place and accumulates onto the bias.
    return autograd::linear(x, weight, bias);
  }

  // gelu(forward(x)) as one op (autograd::linear_gelu): the same graph and
  // numbers on the CPU (there the bias and GELU in one sweep after the GEMM);
  // on a GPU under fast kernels, one cuBLASLt call.
  Tensor forward_gelu(const Tensor& x) {
    LOOM_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "Linear: input ", x.shape(), " does not end in ",
               weight.size(1), " features (weight ", weight.shape(), ")");
    return autograd::linear_gelu(x, weight, bias);
  }
};

}  // namespace loom::nn
