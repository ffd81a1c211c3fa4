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

#include <memory>
#include <string>
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

// A layer's experts, children named by their index in the layer ("0" .. "E-1",
// as transformers' experts.M), from `first` on for expert parallelism's slice
// of E / ep experts (parallel/expert_parallel/expert_parallel.h), so that a
// rank's expert keeps its global name: blocks.N.moe.experts.M.w1.weight.
class ExpertList : public Module {
 public:
  explicit ExpertList(int64_t first = 0) : first_(first) {}
  void push_back(std::shared_ptr<Expert> e) {
    items_.push_back(register_module(std::to_string(first_ + int64_t(items_.size())), std::move(e)));
  }
  int64_t first() const { return first_; }
  size_t size() const { return items_.size(); }
  const std::shared_ptr<Expert>& operator[](size_t i) const { return items_.at(i); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  int64_t first_;
  std::vector<std::shared_ptr<Expert>> items_;
};

// permuted: [M, C], rows grouped by expert, tokens_per_expert[e] rows each -> [M, C]
Tensor expert_compute(const Tensor& permuted, const std::vector<int64_t>& tokens_per_expert,
                      const std::vector<std::shared_ptr<Expert>>& experts);

}  // namespace loom::nn
