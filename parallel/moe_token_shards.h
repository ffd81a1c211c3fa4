// A mixture of experts whose micro-batch is split over ranks: sequence
// parallelism gives each tp rank T/tp of the tokens, context parallelism each
// cp rank its zig-zag chunks. Routing is per token, so each rank routes and
// computes the tokens it holds; what is defined over the micro-batch is summed
// over the ranks holding its other tokens (nn::TokenShards, one all-reduce of
// 3E + 2 numbers per MoE layer and micro-batch):
//   the aux loss     E · Σ_e f_e · P_e with f_e (no gradient) over the whole
//                    micro-batch, P_e over this rank's tokens: the gradient
//                    each token's probabilities get is one process's
//                    (Megatron's aux loss over the tp x cp group); under
//                    sequence parallelism divided by tp, whose ranks sum
//                    their gradients (cp averages them, as dp does)
//   the loads        DeepSeek's bias moves by the micro-batch's load, and the
//                    log reports it: every such rank holds the same sums
// Capacity is not: which slot an expert drops depends on the order of every
// token of the micro-batch, so --capacity-factor with --sequence-parallel or
// --cp is refused (train/checks_moe.cpp).
#pragma once

#include "nn/module.h"
#include "parallel/comm/process_group.h"

namespace loom::parallel {

// Sets every MoE layer's token shards under model: over sp_tp (tp under
// sequence parallelism, or null) and cp (or null). The groups must outlive model.
void use_moe_token_shards(nn::Module& model, ProcessGroup* sp_tp, ProcessGroup* cp);

}  // namespace loom::parallel
