// --memory-report's activation formula for a mixture of experts, from the routing's counts (nn/moe.h's
// RoutingStats::loads, one [E] per forward): the rows each micro-batch kept (a capacity) and sent to this
// rank's experts (--ep), and the micro-batch among them whose rows cost most (optim/moe_activations.h).
#include <algorithm>

#include "train/diagnostics.h"

namespace loom::train {

double Diagnostics::costliest_micro_batch(const optim::ActivationCase& c) const {
  const std::vector<nn::MoE*> moe = nn::moe_layers(*m_.chunks);
  const bool routed_rows = pgm_.ep_size > 1 || c_.cfg.moe.capacity_factor > 0;
  if (!routed_rows || c.micro_batches == 1 || moe.empty() || moe.back()->stats.loads.size() != size_t(c.micro_batches))
    return optim::predict_activations(c).total;
  // --ep or a capacity with --grad-accum: each micro-batch routes its own rows (to this rank's experts; kept
  // by the capacity), so the peak is that of the micro-batch whose rows cost most (the first one without the
  // later ones' .grad tensors).
  double most = 0;
  for (size_t j = 0; j < moe.back()->stats.loads.size(); ++j) {
    optim::ActivationCase one = c;
    micro_batch_routing(moe, one, j);
    if (j == 0) one.micro_batches = 1;
    most = std::max(most, optim::predict_activations(one).total);
  }
  return most;
}

// The rows micro-batch j of the step routed: with a capacity, those each block kept of this rank's slots
// (their mean over the blocks and the last block's); under ep, those its experts received.
void Diagnostics::micro_batch_routing(const std::vector<nn::MoE*>& moe, optim::ActivationCase& c, size_t j) const {
  if (c_.cfg.moe.capacity_factor > 0) {
    c.moe_kept_rows = 0;
    for (nn::MoE* layer : moe) {
      c.moe_last_rows = 0;
      for (int64_t g : layer->stats.loads.at(j)) c.moe_last_rows += double(g);
      c.moe_kept_rows += c.moe_last_rows / double(moe.size());
    }
  }
  if (pgm_.ep_size > 1) received_rows(moe, c, j);
}

// Expert parallelism: the rows each of this rank's experts computed in micro-batch j of the step, from
// every rank of its ep group (collective over ep): per block R, averaged over the blocks (what they
// keep), and the last block's per expert (its backward runs first).
void Diagnostics::received_rows(const std::vector<nn::MoE*>& moe, optim::ActivationCase& c, size_t j) const {
  c.moe_ep = pgm_.ep_size;
  double rows = 0;
  for (nn::MoE* layer : moe) {
    Tensor load = from_vector(layer->stats.loads.at(j));  // [E] rows this rank sent to each expert
    pgm_.ep_group().all_reduce(load, parallel::ReduceOp::Sum);
    const std::vector<int64_t> all = load.to_vector<int64_t>();
    const auto first = all.begin() + layer->experts->first();
    c.moe_local_groups.assign(first, first + int64_t(layer->experts->size()));
    for (int64_t g : c.moe_local_groups) rows += double(g);
  }
  c.moe_received_rows = rows / double(moe.size());
}

}  // namespace loom::train
