// RMSNorm over the last dim (Zhang & Sennrich 2019), Llama's norm: LayerNorm
// without re-centring and without a bias, y = x / sqrt(mean(x²) + eps) * weight.
// weight = 1 at init. One fused per-row kernel (tensor/kernels/rmsnorm.h).
#pragma once

#include "nn/layernorm.h"

namespace loom::nn {

struct RMSNorm : LayerNorm {
  explicit RMSNorm(int64_t C, double eps = 1e-5) : LayerNorm(C, eps, /*with_bias=*/false) {}

  // x: [..., C] -> [..., C]
  Tensor forward(const Tensor& x) override {
    LOOM_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(0), "RMSNorm: input ", x.shape(), " does not end in ",
               weight.size(0), " features");
    return autograd::rms_norm(x, weight, eps);
  }

  std::shared_ptr<LayerNorm> copy() const override {
    auto out = std::make_shared<RMSNorm>(weight.size(0), eps);
    out->copy_params_from(*this);
    return out;
  }
};

}  // namespace loom::nn
