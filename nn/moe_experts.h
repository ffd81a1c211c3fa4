// The experts of a mixture-of-experts layer and their compute step: E SwiGLU
// MLPs (Mixtral's names: w1 the gate, w3 the up projection, w2 the down one),
// each run on its own contiguous group of the permuted rows
// (nn/moe_token_dispatcher.h). One GEMM chain per expert, in a loop, as
// Megatron-core's SequentialMLP; grouped GEMM (its GroupedMLP) would run all
// the groups in one kernel and is a speed-up, not a different result.
//   x_e [M_e, C] -> w2(silu(w1 x_e) * w3 x_e) [M_e, C],   w1, w3 [I, C], w2 [C, I]
// An expert that received no token still runs on its empty group: its weights
// then get a zero gradient (Megatron's grad buffer holds zeros for them too),
// so every parameter has a gradient every step, whatever the routing.
#pragma once

#include <vector>

#include "nn/linear.h"

namespace loom::nn {

struct Expert : Layer {
  std::shared_ptr<Linear> w1, w2, w3;  // [I, C], [C, I], [I, C], no biases

  // Draws w1, w2, w3 in that order (transformers' MixtralBlockSparseTop2MLP registers them so).
  Expert(int64_t C, int64_t I, Generator& gen, double proj_std) {
    w1 = register_module("w1", std::make_shared<Linear>(C, I, gen, 0.02, false));
    w2 = register_module("w2", std::make_shared<Linear>(I, C, gen, proj_std, false));
    w3 = register_module("w3", std::make_shared<Linear>(C, I, gen, 0.02, false));
  }

  // x: [M_e, C] -> [M_e, C]
  Tensor forward(const Tensor& x) override {
    using namespace loom::autograd;
    return w2->forward(silu(w1->forward(x)) * w3->forward(x));
  }
};

// permuted: [M, C], rows grouped by expert, tokens_per_expert[e] rows each -> [M, C]
Tensor expert_compute(const Tensor& permuted, const std::vector<int64_t>& tokens_per_expert,
                      const std::vector<std::shared_ptr<Expert>>& experts);

}  // namespace loom::nn
