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

namespace {

// The micro-batch's routing, over this rank's tokens and, under TokenShards,
// summed over the ranks holding the others (one collective of 3E + 2 numbers).
struct MicroBatchRouting {
  std::vector<double> chosen, kept, prob_sum;  // [E] each: slots chosen, slots kept, Σ_n probs[n, e]
  double tokens = 0, dropped = 0;
  std::vector<double> fraction() const {       // f_e = chosen_e / N (Σ f_e = k)
    std::vector<double> f;
    for (double c : chosen) f.push_back(c / tokens);
    return f;
  }
  double balance() const {                     // E · Σ_e f_e · P_e, the aux loss's value
    double b = 0;
    for (size_t e = 0; e < chosen.size(); ++e) b += chosen[e] / tokens * (prob_sum[e] / tokens);
    return double(chosen.size()) * b;
  }
};

MicroBatchRouting count_routing(const RouterOutput& r, const RoutingMap& map, int64_t E, const TokenShards& shards) {
  const size_t e_ = size_t(E);
  std::vector<double> v(3 * e_ + 2, 0.0);  // [chosen | kept | prob_sum | tokens, dropped]
  for (int64_t e : ops::contiguous(r.chosen).to_vector<int64_t>()) v[size_t(e)] += 1;
  for (size_t e = 0; e < e_; ++e) v[e_ + e] = double(map.tokens_per_expert[e]);
  const std::vector<double> p = ops::to(r.probs.alias(), kCPU, kFloat64).to_vector<double>();  // [N, E]
  for (size_t i = 0; i < p.size(); ++i) v[2 * e_ + i % e_] += p[i];
  v[3 * e_] = double(r.probs.size(0)), v[3 * e_ + 1] = double(map.dropped);
  if (shards.sum) shards.sum(v);
  MicroBatchRouting m;
  m.chosen.assign(v.begin(), v.begin() + long(e_));
  m.kept.assign(v.begin() + long(e_), v.begin() + long(2 * e_));
  m.prob_sum.assign(v.begin() + long(2 * e_), v.begin() + long(3 * e_));
  m.tokens = v[3 * e_], m.dropped = v[3 * e_ + 1];
  return m;
}

}  // namespace

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
  Tensor out = reshape(unpermute(computed, r.weights, map), x.shape());                     // [B, T, C]
  if (shared_experts) out = out + shared_experts->forward(x);
  const bool counting = is_training() && GradMode::is_enabled();  // not evaluation, not a recompute's rerun
  const bool balancing = o.aux_loss_coef > 0 && GradMode::is_enabled();
  // This rank's part of the micro-batch's aux losses: each is a mean over the
  // micro-batch's tokens, and tp under sequence parallelism sums the parts' gradients.
  const double share = 1.0 / double(token_shards.summed_ranks);
  if (balancing || counting) {
    const MicroBatchRouting m = count_routing(r, map, o.experts, token_shards);
    // E · Σ_e f_e · P_e with f_e over the whole micro-batch, P_e over this rank's tokens
    if (balancing) out = attach_aux_loss(out, load_balancing_loss(r.probs, m.fraction()), o.aux_loss_coef * share);
    if (counting) {
      stats.aux_loss += m.balance();
      stats.slots += int64_t(m.tokens) * K, stats.dropped += int64_t(m.dropped), ++stats.forwards;
      for (size_t e = 0; e < m.kept.size(); ++e) stats.load[e] += int64_t(m.kept[e]), step_load[e] += int64_t(m.kept[e]);
      stats.last_load.assign(map.tokens_per_expert.begin(), map.tokens_per_expert.end());  // this rank's own
      stats.loads.push_back(stats.last_load);
    }
  }
  if (o.z_loss_coef > 0 && GradMode::is_enabled())
    out = attach_aux_loss(out, router_z_loss(r.logits), o.z_loss_coef * share);
  return dropout->forward(out);
}

std::shared_ptr<MoE> MoE::copy_routed() const {
  MoEOptions routed = o;
  routed.shared_experts = 0;
  Generator unused(0);  // the weights drawn here are overwritten below
  auto out = std::make_shared<MoE>(gate->weight.size(1), (*experts)[0]->w1->weight.size(0), routed, unused, 0.02,
                                   dropout->p);
  NoGradGuard no_grad;
  out->load_state_dict(state_dict(), /*strict=*/false);  // all but shared_experts.*
  if (score_bias.defined()) ops::copy_(out->score_bias, score_bias);
  return out;
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
    m->stats = RoutingStats{0, 0, 0.0, 0, std::vector<int64_t>(m->stats.load.size(), 0), {}, {}};
  }
  return total;
}

}  // namespace loom::nn
