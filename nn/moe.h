// A sparse mixture-of-experts layer in place of a block's MLP (Mixtral,
// arXiv:2401.04088; transformers' MixtralSparseMoeBlock): each token is sent to
// k of E SwiGLU experts, and their outputs, weighted by the router, are summed.
// Parameters per layer: gate [E, C] + E x (w1, w3 [I, C], w2 [C, I]), of which
// each token uses k experts' worth: E/k times the weights for the same FLOPs.
//   x [B, T, C] -> tokens [N = B T, C]
//   route        nn/moe_router.h           chosen [N, K], weights [N, K]
//   routing map  nn/moe_token_dispatcher.h which rows go where (drops with a capacity)
//   permute                                [N, C] -> [M, C], grouped by expert
//   expert compute  nn/moe_experts.h       [M, C] -> [M, C]
//   unpermute                              [M, C] -> [N, C], weighted sum of each token's k
//   + shared experts (DeepSeek/Qwen): an always-on SwiGLU of width S I on every token
//   + the aux losses (nn/moe_aux_loss.h), attached to the output
// When other ranks hold the micro-batch's other tokens (sequence parallelism
// splits T over tp, context parallelism over cp: TokenShards), each rank routes
// and computes its own tokens, and what is over the micro-batch - the aux
// loss's f_e, the loads - is summed over those ranks first.
// Balancing by bias (DeepSeek-V3): score_bias [E] is added to the scores for
// the choice only; after each optimizer step update_router_bias moves it by
// rate · sign(mean load - load_e), the loads counted over the step's tokens.
#pragma once

#include <functional>
#include <vector>

#include "nn/dropout.h"
#include "nn/mlp.h"
#include "nn/moe_experts.h"

namespace loom::nn {

struct MoEOptions {
  int64_t experts = 0;             // E; 0: a dense MLP, no MoE
  int64_t experts_per_token = 2;   // k
  int64_t shared_experts = 0;      // S always-on experts (one SwiGLU of width S I)
  double capacity_factor = 0.0;    // 0: dropless; > 0: Switch's capacity, the overflow dropped
  double aux_loss_coef = 0.0;      // the load-balancing loss's weight (Mixtral: 0.02 in training)
  double z_loss_coef = 0.0;        // the router z-loss's weight (ST-MoE: 1e-3)
  double bias_update_rate = 0.0;   // > 0: DeepSeek-V3's aux-loss-free bias, moved by this much per step
};

// What the layers routed since the last take_routing_stats (training forwards only).
struct RoutingStats {
  int64_t slots = 0, dropped = 0;  // token-expert slots, and those dropped for capacity
  double aux_loss = 0.0;           // Σ over forwards of the load-balancing loss (unweighted)
  int64_t forwards = 0;
  std::vector<int64_t> load;       // [E] slots each expert computed
  std::vector<int64_t> last_load;  // [E] of them in the latest forward (the memory ledger's, under --ep)
  std::vector<std::vector<int64_t>> loads;  // [forward][E] each forward's (the ledger's per micro-batch)
};

// The ranks that hold the other tokens of this rank's micro-batch (set by
// parallel/moe_token_shards.h; empty on one process and under plain tp, where
// every tp rank holds all of them).
struct TokenShards {
  // Sums per-expert numbers over those ranks, in place.
  std::function<void(std::vector<double>&)> sum;
  // How many of them sum their gradients (tp under sequence parallelism) rather
  // than average them as data parallel does (cp): each rank's aux losses are
  // divided by it, so that the sum over tp of each rank's share is the whole.
  int64_t summed_ranks = 1;
};

struct MoE : Layer {
  MoEOptions o;
  std::shared_ptr<Linear> gate;                    // [E, C], no bias (the router)
  std::shared_ptr<ExpertList> experts;             // E x Expert (E / ep under expert parallelism)
  std::shared_ptr<Layer> shared_experts;           // SwiGLU [S I, C] ... (an MLP; tp's cut of it), or null
  std::shared_ptr<Dropout> dropout;
  Tensor score_bias;                               // [E] fp32, not a parameter; undefined without the bias
  RoutingStats stats;                              // for the log (take_routing_stats)
  std::vector<int64_t> step_load;                  // [E] for the bias (update_router_bias)
  // The expert compute step, permuted [M, C] -> [M, C]; empty: every expert here (expert_compute).
  // Expert parallelism sets dispatch -> compute -> combine (parallel/expert_parallel/token_dispatcher_all_to_all.h).
  std::function<Tensor(const Tensor& permuted, const std::vector<int64_t>& tokens_per_expert)> expert_step;
  TokenShards token_shards;

  // Draws gate, then each expert's w1, w2, w3, then the shared experts, from gen.
  MoE(int64_t C, int64_t I, const MoEOptions& o, Generator& gen, double proj_std, double p_dropout = 0.0);
  // x: [B, T, C] -> [B, T, C]
  Tensor forward(const Tensor& x) override;
  MoE* as_moe() override { return this; }
  // A new layer holding copies of the router, the experts and the routing bias,
  // without the shared experts (tensor parallelism cuts those: its replicated
  // experts start from the full model's).
  std::shared_ptr<MoE> copy_routed() const;
};

// The MoE layers under root, in module order.
std::vector<MoE*> moe_layers(Module& root);

// DeepSeek-V3's update, after an optimizer step: score_bias_e += rate · sign(mean load - load_e)
// over the loads counted since the last call (step_load, then cleared).
void update_router_bias(MoE& layer);

// Sums and clears the stats of every MoE layer under root.
RoutingStats take_routing_stats(Module& root);

}  // namespace loom::nn
