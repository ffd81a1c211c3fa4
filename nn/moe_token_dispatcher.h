// Moving tokens to their experts and back, in the steps Megatron-core's token
// dispatcher names (Megatron's megatron/core/transformer/moe/token_dispatcher.py), so that
// expert parallelism can later put its all-to-alls (dispatch, combine) between them:
//   routing map   which (token, slot) goes to which expert, in expert order;
//                 with a capacity, the overflow of each expert is dropped
//   permute       x [N, C] -> rows grouped by expert [M, C] (M = N K - dropped)
//   (expert compute: nn/moe_experts.h)
//   unpermute     y [M, C] -> [N, C]: out[n] = Σ_k weights[n, k] · y[row of (n, k)]
// A worked layout, N = 3 tokens, K = 2, E = 3, chosen = [[2, 0], [0, 1], [2, 1]]:
//   expert 0 gets slots (0,1), (1,0); expert 1: (1,1), (2,1); expert 2: (0,0), (2,0)
//   tokens_per_expert = [2, 2, 2], permuted_token = [0, 1, 1, 2, 0, 2]
//   slot_row (the permuted row of each slot n K + k) = [4, 0, 1, 2, 5, 3]
// Dropping (Switch Transformer, arXiv:2101.03961): capacity = ceil(F N K / E)
// rows per expert; the slots of the first tokens of the micro-batch keep their
// place (token order), the rest point at a zero row (slot_row = M), so a
// dropped slot adds nothing and its token passes on by the residual alone.
#pragma once

#include <vector>

#include "tensor/tensor.h"

namespace loom::nn {

struct RoutingMap {
  std::vector<int64_t> tokens_per_expert;  // [E] rows each expert computes (after drops)
  Tensor permuted_token;                   // [M] int64: the token each permuted row is a copy of
  Tensor slot_row;                         // [N K] int64: each slot's permuted row; M when dropped
  int64_t dropped = 0;                     // slots dropped for capacity
};

// chosen: [N, K] int64 on the host (nn/moe_router.h). capacity < 0: dropless.
RoutingMap make_routing_map(const Tensor& chosen, int64_t num_experts, int64_t capacity = -1);

// Switch's capacity, ceil(factor · tokens · k / experts) rows per expert.
int64_t expert_capacity(double factor, int64_t tokens, int64_t k, int64_t num_experts);

// x: [N, C] -> [M, C], the rows grouped by expert (a gather; its backward sums each token's copies).
Tensor permute(const Tensor& x, const RoutingMap& map);

// y: [M, C], weights: [N, K] -> [N, C]: each token's k expert outputs, weighted and summed.
Tensor unpermute(const Tensor& y, const Tensor& weights, const RoutingMap& map);

}  // namespace loom::nn
