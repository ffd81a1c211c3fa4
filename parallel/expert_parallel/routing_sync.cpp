#include "parallel/expert_parallel/routing_sync.h"

#include "tensor/ops.h"

namespace loom::parallel {

namespace {

// counts (integers below 2^53: exact in float64) summed over dp, in place.
void sum_over(std::vector<int64_t>& counts, ProcessGroup& dp) {
  if (dp.size() == 1 || counts.empty()) return;
  Tensor t = from_vector(std::vector<double>(counts.begin(), counts.end()), {int64_t(counts.size())});
  dp.all_reduce(t, ReduceOp::Sum);
  const std::vector<double> summed = t.to_vector<double>();
  for (size_t i = 0; i < counts.size(); ++i) counts[i] = int64_t(summed[i]);
}

// s summed over group: [slots, dropped, aux_loss, forwards, load_0 .. load_{E-1}] in one all-reduce.
void sum_over(nn::RoutingStats& s, ProcessGroup& group) {
  std::vector<double> v = {double(s.slots), double(s.dropped), s.aux_loss, double(s.forwards)};
  v.insert(v.end(), s.load.begin(), s.load.end());
  Tensor t = from_vector(v, {int64_t(v.size())});
  group.all_reduce(t, ReduceOp::Sum);
  v = t.to_vector<double>();
  s.slots = int64_t(v[0]), s.dropped = int64_t(v[1]), s.aux_loss = v[2], s.forwards = int64_t(v[3]);
  for (size_t e = 0; e < s.load.size(); ++e) s.load[e] = int64_t(v[4 + e]);
}

}  // namespace

void update_router_biases(nn::Module& model, ProcessGroup& dp) {
  for (nn::MoE* moe : nn::moe_layers(model)) {
    if (!moe->score_bias.defined()) continue;
    sum_over(moe->step_load, dp);  // the load over every replica's tokens
    nn::update_router_bias(*moe);
  }
}

nn::RoutingStats take_routing_stats(nn::Module& model, ProcessGroup& dp) {
  nn::RoutingStats s = nn::take_routing_stats(model);
  if (dp.size() == 1 || s.load.empty()) return s;  // one rank, or no MoE layer: nothing to sum
  sum_over(s, dp);
  return s;
}

nn::RoutingStats take_routing_stats(nn::Module& model, ProcessGroup& dp, ProcessGroup& pp, int64_t experts) {
  nn::RoutingStats s = take_routing_stats(model, dp);
  if (pp.size() == 1 || experts == 0) return s;
  if (s.load.empty()) s.load.assign(size_t(experts), 0);  // a stage without MoE layers adds nothing, but must take part
  sum_over(s, pp);
  return s;
}

}  // namespace loom::parallel
