// The transformer's feed-forward network, then dropout on the residual branch.
//   GPT-2 (gelu):   C -> 4C, GELU (tanh approximation), 4C -> C
//   Llama (swiglu): down(silu(gate(x)) * up(x)), C -> F twice, F -> C
//                   (SwiGLU, Shazeer 2020: a gated unit; with F = 8C/3 its
//                   three matrices hold as many weights as GELU's two at 4C)
#pragma once

#include "nn/dropout.h"
#include "nn/linear.h"

namespace loom::nn {

struct MLP : Layer {
  bool swiglu;
  std::shared_ptr<Linear> c_gate;  // [F, C], SwiGLU only (transformers' gate_proj)
  std::shared_ptr<Linear> c_fc;    // [F, C], the up projection (F = 4C for GPT-2)
  std::shared_ptr<Linear> c_proj;  // [C, F], the down projection, a residual projection
  std::shared_ptr<Dropout> dropout;

  // proj_std: GPT-2 scales residual projections by 1/sqrt(2 n_layer) (see gpt.h).
  // hidden 0 means 4C. Weights are drawn in registration order: (c_gate,) c_fc, c_proj.
  MLP(int64_t C, Generator& gen, double proj_std, double p_dropout = 0.0, int64_t hidden = 0, bool swiglu = false,
      bool bias = true)
      : swiglu(swiglu) {
    const int64_t F = hidden > 0 ? hidden : 4 * C;
    if (swiglu) c_gate = register_module("c_gate", std::make_shared<Linear>(C, F, gen, 0.02, bias));
    c_fc = register_module("c_fc", std::make_shared<Linear>(C, F, gen, 0.02, bias));
    c_proj = register_module("c_proj", std::make_shared<Linear>(F, C, gen, proj_std, bias));
    dropout = register_module("dropout", std::make_shared<Dropout>(p_dropout, gen.next_u64()));
  }

  // x: [B, T, C] -> h: [B, T, F] -> [B, T, C]. GELU's c_fc->forward_gelu(x) is
  // gelu(c_fc->forward(x)) as one op (fused into the GEMM on a GPU).
  Tensor forward(const Tensor& x) override {
    using namespace loom::autograd;
    Tensor h = swiglu ? silu(c_gate->forward(x)) * c_fc->forward(x) : c_fc->forward_gelu(x);
    return dropout->forward(c_proj->forward(h));
  }
};

}  // namespace loom::nn
