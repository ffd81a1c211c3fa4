// The transformer's feed-forward network: C -> 4C, GELU (tanh approximation,
// as GPT-2), 4C -> C, then dropout on the residual branch.
#pragma once

#include "nn/dropout.h"
#include "nn/linear.h"

namespace loom::nn {

struct MLP : Layer {
  std::shared_ptr<Linear> c_fc;    // [4C, C]
  std::shared_ptr<Linear> c_proj;  // [C, 4C], a residual projection
  std::shared_ptr<Dropout> dropout;

  // proj_std: GPT-2 scales residual projections by 1/sqrt(2 n_layer) (see gpt.h).
  MLP(int64_t C, Generator& gen, double proj_std, double p_dropout = 0.0) {
    c_fc = register_module("c_fc", std::make_shared<Linear>(C, 4 * C, gen));
    c_proj = register_module("c_proj", std::make_shared<Linear>(4 * C, C, gen, proj_std));
    dropout = register_module("dropout", std::make_shared<Dropout>(p_dropout, gen.next_u64()));
  }

  // x: [B, T, C] -> h: [B, T, 4C] -> [B, T, C]
  Tensor forward(const Tensor& x) override {
    Tensor h = autograd::gelu(c_fc->forward(x));
    return dropout->forward(c_proj->forward(h));
  }
};

}  // namespace loom::nn
