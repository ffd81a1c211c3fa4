// Expert parallelism's token dispatcher (MoEAlltoAllTokenDispatcher in
// Megatron-LM's megatron/core/transformer/moe/token_dispatcher.py): the E experts are split
// over the N ranks of the ep group, E/N consecutive experts each, and the
// permuted rows travel to the rank of their expert and back. Between
// nn/moe_token_dispatcher.h's permute and unpermute (nn::MoE::expert_step):
//   permute              (nn/moe.cpp) rows grouped by expert       [M, C]
//   exchange split sizes each rank learns how many rows every rank sends to each of its experts
//   dispatch             all-to-all: rows to their expert's rank   [M, C] -> [R, C]
//   sort by local expert [s0: e0 e1][s1: e0 e1] -> [e0: s0 s1][e1: s0 s1]
//   expert compute       this rank's E/N experts on their groups   [R, C]
//   unsort, combine      back to source order; all-to-all home     [R, C] -> [M, C]
//   unpermute            (nn/moe.cpp) each token's k outputs, weighted
// A worked exchange, ep 2, E 4 (rank 0: experts 0, 1; rank 1: experts 2, 3):
//   rank 0 routed tokens_per_expert [3, 1, 2, 0], rank 1 [1, 2, 2, 2]
//   input splits (rows to each rank): rank 0 [4, 2], rank 1 [3, 4]
//   after the exchange, rank 0 holds rows for (source, expert) (0,0) 3, (0,1) 1, (1,0) 1, (1,1) 2:
//   output splits [4, 3]; sorted, expert 0 gets 3 + 1 rows, expert 1 gets 1 + 2
// Routing, capacity and the aux loss stay on the rank that routed the tokens,
// over its own micro-batch (as Megatron: the capacity counts local tokens).
// The backward of dispatch is an all-to-all home, of combine one out
// (all_to_all.h). Weights: each rank holds only its E/N experts
// (expert_parallel.h), so each expert's gradient sums the rows of every rank of
// the ep group that routed to it; the expert-dp group sums the rest.
// docs/19-mixture-of-experts.md.
#pragma once

#include <memory>
#include <vector>

#include "nn/moe.h"
#include "parallel/comm/process_group.h"

namespace loom::parallel {

// permuted: [M, C] grouped by the E global experts, tokens_per_expert [E] ->
// [M, C], each row through its expert on the rank that holds it. experts: this
// rank's E/N of the layer (experts ep.rank() E/N .. (ep.rank() + 1) E/N - 1).
// Collective over ep (forward and backward).
Tensor dispatch_compute_combine(const Tensor& permuted, const std::vector<int64_t>& tokens_per_expert,
                                const std::vector<std::shared_ptr<nn::Expert>>& experts, ProcessGroup& ep);

}  // namespace loom::parallel
