#include "nn/moe_token_dispatcher.h"

#include <cmath>

#include "autograd/functions.h"
#include "tensor/ops.h"

namespace loom::nn {

int64_t expert_capacity(double factor, int64_t tokens, int64_t k, int64_t num_experts) {
  return int64_t(std::ceil(factor * double(tokens * k) / double(num_experts)));
}

RoutingMap make_routing_map(const Tensor& chosen, int64_t E, int64_t capacity) {
  LOOM_CHECK(chosen.dim() == 2 && chosen.dtype() == kInt64 && chosen.device().is_cpu(),
             "make_routing_map: expected the chosen experts [N, K] int64 on the host, got ", chosen.shape(), " ",
             dtype_name(chosen.dtype()));
  const int64_t N = chosen.size(0), K = chosen.size(1);
  const std::vector<int64_t> c = ops::contiguous(chosen).to_vector<int64_t>();
  // Each expert's slots in token order; past the capacity they are dropped.
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(E));
  RoutingMap map;
  for (int64_t s = 0; s < N * K; ++s) {
    const int64_t e = c[size_t(s)];
    LOOM_CHECK(0 <= e && e < E, "make_routing_map: expert ", e, " of slot ", s, " is not in [0, ", E, ")");
    if (capacity >= 0 && int64_t(slots[size_t(e)].size()) >= capacity) {
      ++map.dropped;
      continue;
    }
    slots[size_t(e)].push_back(s);
  }
  const int64_t M = N * K - map.dropped;
  std::vector<int64_t> token, row(size_t(N * K), M);  // M: the zero row unpermute appends
  for (int64_t e = 0; e < E; ++e) {
    map.tokens_per_expert.push_back(int64_t(slots[size_t(e)].size()));
    for (int64_t s : slots[size_t(e)]) {
      row[size_t(s)] = int64_t(token.size());
      token.push_back(s / K);
    }
  }
  map.permuted_token = from_vector(token, {M});
  map.slot_row = from_vector(row, {N * K});
  return map;
}

Tensor permute(const Tensor& x, const RoutingMap& map) {
  return autograd::index_select(x, 0, ops::to(map.permuted_token, x.device()));  // [M, C]
}

Tensor unpermute(const Tensor& y, const Tensor& weights, const RoutingMap& map) {
  using namespace autograd;
  const int64_t N = weights.size(0), K = weights.size(1), C = y.size(1);
  // [M + 1, C]: a zero row at M for the dropped slots, then each slot's row: [N K, C] -> [N, K, C]
  Tensor padded = cat({y, zeros({1, C}, y.dtype(), y.device())}, 0);
  Tensor per_slot = reshape(index_select(padded, 0, ops::to(map.slot_row, y.device())), {N, K, C});
  return sum(per_slot * unsqueeze(weights, 2), {1});  // Σ_k weights[n, k] y[row(n, k)]: [N, C]
}

}  // namespace loom::nn
