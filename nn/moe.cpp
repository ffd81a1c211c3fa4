#include "nn/moe.h"

#include "nn/moe_aux_loss.h"
#include "nn/moe_router.h"
#include "nn/moe_token_dispatcher.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::nn {

MoE::MoE(int64_t C, int64_t I, const MoEOptions& opt, Generator& gen, double proj_std, double p_dropout) : o(opt) {
  LOOM_CHECK(o.experts >= 1 && 1 <= o.experts_per_token && o.experts_per_token <= o.experts,
             "MoE: ", o.experts, " experts, ", o.experts_per_token, " per token (expected 1 <= k <= E)");
  gate = register_module("gate", std::make_shared<Linear>(C, o.experts, gen, 0.02, false));
  experts = register_module("experts", std::make_shared<ExpertList>());
  for (int64_t e = 0; e < o.experts; ++e) experts->push_back(std::make_shared<Expert>(C, I, gen, proj_std));
  if (o.shared_experts > 0)
    shared_experts = register_module(
        "shared_experts", std::make_shared<MLP>(C, gen, proj_std, 0.0, o.shared_experts * I, /*swiglu=*/true, false));
  dropout = register_module("dropout", std::make_shared<Dropout>(p_dropout, gen.next_u64()));
  if (o.bias_update_rate > 0) score_bias = zeros({o.experts});
  stats.load.assign(size_t(o.experts), 0);
  step_load.assign(size_t(o.experts), 0);
}

Tensor MoE::forward(const Tensor& x) {
  using namespace autograd;
  const int64_t C = x.size(-1), N = x.numel() / C, K = o.experts_per_token;
  const Tensor tokens = reshape(x, {N, C});                                                  // [N, C]
  const RouterOutput r = route_top_k(tokens, gate->weight, K, score_bias);  // the choice is made on the host
  const int64_t capacity = o.capacity_factor > 0 ? expert_capacity(o.capacity_factor, N, K, o.experts) : -1;
  const RoutingMap map = make_routing_map(r.chosen, o.experts, capacity);
  const Tensor permuted = permute(tokens, map);                                              // [M, C]
  const Tensor computed = expert_step ? expert_step(permuted, map.tokens_per_expert)  // [M, C]
                                      : expert_compute(permuted, map.tokens_per_expert, {experts->begin(), experts->end()});
  Tensor out = unpermute(computed, r.weights, map);                                          // [N, C]
  if (shared_experts) out = out + shared_experts->forward(tokens);
  const bool counting = is_training() && GradMode::is_enabled();  // not evaluation, not a recompute's rerun
  if (o.aux_loss_coef > 0 || counting) {
    const Tensor balance = load_balancing_loss(r.probs, r.chosen);
    if (o.aux_loss_coef > 0 && GradMode::is_enabled()) out = attach_aux_loss(out, balance, o.aux_loss_coef);
    if (counting) stats.aux_loss += ops::to(balance.alias(), kCPU, kFloat64).item<double>();
  }
  if (o.z_loss_coef > 0 && GradMode::is_enabled()) out = attach_aux_loss(out, router_z_loss(r.logits), o.z_loss_coef);
  if (counting) {
    stats.slots += N * K, stats.dropped += map.dropped, ++stats.forwards;
    for (int64_t e = 0; e < o.experts; ++e) {
      stats.load[size_t(e)] += map.tokens_per_expert[size_t(e)];
      step_load[size_t(e)] += map.tokens_per_expert[size_t(e)];
    }
  }
  return dropout->forward(reshape(out, x.shape()));
}

std::vector<MoE*> moe_layers(Module& root) {
  std::vector<MoE*> found;
  if (MoE* moe = root.as_moe()) found.push_back(moe);
  for (const auto& [name, child] : root.named_children())
    for (MoE* m : moe_layers(*child)) found.push_back(m);
  return found;
}

void update_router_bias(MoE& layer) {
  if (!layer.score_bias.defined()) return;
  const int64_t E = layer.o.experts;
  double mean = 0;
  for (int64_t l : layer.step_load) mean += double(l) / double(E);
  float* b = layer.score_bias.data<float>();
  for (int64_t e = 0; e < E; ++e) {
    const double err = mean - double(layer.step_load[size_t(e)]);  // > 0: underloaded, raise its bias
    b[e] += float(layer.o.bias_update_rate * double((err > 0) - (err < 0)));
  }
  layer.step_load.assign(size_t(E), 0);
}

RoutingStats take_routing_stats(Module& root) {
  RoutingStats total;
  for (MoE* m : moe_layers(root)) {
    total.slots += m->stats.slots, total.dropped += m->stats.dropped, total.aux_loss += m->stats.aux_loss;
    total.forwards += m->stats.forwards;
    if (total.load.empty()) total.load.assign(m->stats.load.size(), 0);
    for (size_t e = 0; e < m->stats.load.size() && e < total.load.size(); ++e) total.load[e] += m->stats.load[e];
    m->stats = RoutingStats{0, 0, 0.0, 0, std::vector<int64_t>(m->stats.load.size(), 0)};
  }
  return total;
}

}  // namespace loom::nn
