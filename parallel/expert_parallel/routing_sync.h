// The routing counts of a mixture of experts summed over the data-parallel
// ranks, so that what depends on the whole step's load sees the whole step:
//   DeepSeek-V3's bias     bias_e += rate · sign(mean load - load_e) over the
//                          step's tokens on every replica (Megatron all-reduces
//                          tokens_per_expert over tp x cp x dp before its
//                          get_updated_expert_bias), so every replica moves its
//                          bias alike and the replicas stay equal
//   the log's routing      balance, dropped fraction and max load over the
//                          step's micro-batches on every replica
// What stays per rank is the routing itself: each rank routes, drops (capacity
// = ceil(F N k / E) of its own micro-batch's N tokens) and computes the aux loss
// E · Σ_e f_e · P_e over its own micro-batch, as Megatron does. So dp 2 with
// --batch 4 equals one process with --batch 4 --grad-accum 2 (the same
// micro-batches), not --batch 8: docs/19-mixture-of-experts.md says why.
#pragma once

#include "nn/moe.h"
#include "parallel/comm/process_group.h"

namespace loom::parallel {

// After the optimizer step: every MoE layer's step_load summed over dp, then
// nn::update_router_bias. Collective over dp (a no-op without the bias).
void update_router_biases(nn::Module& model, ProcessGroup& dp);

// nn::take_routing_stats, summed over dp. Collective over dp.
nn::RoutingStats take_routing_stats(nn::Module& model, ProcessGroup& dp);

// The same in a pipeline: each stage routes its own layers, so the step's
// numbers are summed over dp, then over the stages (pp), as one process counts
// them over every layer. experts: E, which a stage without MoE layers cannot
// see in its model. Collective over dp, then pp.
nn::RoutingStats take_routing_stats(nn::Module& model, ProcessGroup& dp, ProcessGroup& pp, int64_t experts);

}  // namespace loom::parallel
