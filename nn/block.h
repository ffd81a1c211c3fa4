// One transformer block, pre-LayerNorm as GPT-2: each sub-layer reads a
// normalised copy of the residual stream and adds its output back to it.
//   x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))
#pragma once

#include "nn/attention.h"
#include "nn/layernorm.h"
#include "nn/mlp.h"

namespace loom::nn {

struct Block : Layer {
  std::shared_ptr<LayerNorm> ln_1;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<LayerNorm> ln_2;
  std::shared_ptr<MLP> mlp;

  // Weights are drawn from gen in registration order: attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj.
  Block(int64_t C, int64_t n_head, Generator& gen, double proj_std, double p_dropout = 0.0) {
    ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(C));
    attn = register_module("attn", std::make_shared<CausalSelfAttention>(C, n_head, gen, proj_std, p_dropout));
    ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(C));
    mlp = register_module("mlp", std::make_shared<MLP>(C, gen, proj_std, p_dropout));
  }

  // x: [B, T, C] -> [B, T, C]
  Tensor forward(const Tensor& x) override {
    using namespace loom::autograd;
    Tensor h = x + attn->forward(ln_1->forward(x));
    return h + mlp->forward(ln_2->forward(h));
  }
};

}  // namespace loom::nn
