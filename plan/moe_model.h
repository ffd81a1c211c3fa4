// What a mixture of experts changes in a planned run (ModelShape::experts;
// nn/moe.h; train_gpt --experts E --experts-per-token k --shared-experts S,
// and --ep N, the expert-parallel ranks).
//
// Parameters of a MoE block (Llama's; the first dense_layers blocks stay dense):
// the attention and the two norms as a dense block's, then, in the MLP's place,
//   router    E h          replicated over tp (Megatron's router is)
//   routed    E x 3 h I    w1, w3 [I, h], w2 [h, I]: whole experts, E / ep on a rank
//   shared    S x 3 h I    one SwiGLU of width S I, tensor-parallel as the dense MLP (/ tp)
// A token passes k of the E routed experts, so its FLOPs are the active params':
//   active per MoE block = attention + E h + (k + S) 3 h I
// Published (tests/test_plan.cpp): Mixtral-8x7B 46.7B total / 12.9B active
// (arXiv:2401.04088); DeepSeek-V3 671B / 37B (arXiv:2412.19437).
//
// Expert parallelism (ep ranks carved out of dp, as Megatron's
// expert-model-parallel group): a rank holds E / ep experts of each MoE block,
//   expert params on a rank = MoE blocks x (E / ep) x 3 h I
// each replicated over dp / ep ranks (the expert-dp group), which average their
// gradients and, under ZeRO, shard their optimizer state:
//   optimizer = dense params x bytes/param / dp  +  expert params x bytes/param / (dp / ep)
// (--memory-report's ledger, tests/test_memory_ledger_moe.cpp, measures this at
// ZeRO 0 and ep 1, 2, 4). Activations: the ledger's count (optim/moe_activations.h,
// the shared experts' SwiGLU included: 4 S I / tp elements a token, + SP's two
// gathered inputs) with a balanced router: each rank's experts receive the N k rows it sends, so
// a block keeps 2 e N k h + 16 N k bytes more than at ep 1 (the received, sorted
// and computed rows [R, h] and two indices, less the permuted rows). With a capacity
// factor F each expert keeps at most ceil(F N k / E) of a rank's rows: below F = 1 a
// balanced router's M = E ceil(F N k / E) rows, not N k (the slots [N, k, h] stay).
//
// All-to-all, per MoE block and micro-batch, N = b s / cp tokens on the rank
// (/ tp under sequence parallelism: each tp rank routes its own slice):
//   forward    dispatch [N k, h] to the experts' ranks, combine [N k, h] back
//   backward   the same two, the gradients travelling the other way
//   = 2 x N k h x bytes each way, forward and backward: 4 N k h x bytes a block
// (full recomputation adds the forward's two again). A balanced router keeps
// 1/ep of the rows on the rank: (ep - 1)/ep of them go on the wire, each
// all-to-all (pairwise exchange) taking (ep - 1) alpha + (ep - 1)/ep x S / B.
// The ep group is ep consecutive dp ranks: it spans tp x cp x ep ranks.
#pragma once

#include <cstdint>

#include "plan/comm_model.h"
#include "plan/config.h"

namespace loom::plan {

// The published shapes (their Hugging Face config.json files):
//   Mixtral-8x7B  32 blocks, h 4096, 32 heads, 8 kv heads, vocab 32000, 8 experts
//                 of width 14336, top-2 (seq: 4096 here)
//   DeepSeek-V3   61 blocks, h 7168, 128 heads, vocab 129280, 256 experts of width
//                 2048, top-8, 1 shared; blocks 0-2 dense, width 18432; attention
//                 is MLA, low-rank: q 7168x1536 + 1536x(128 x 192), kv 7168x(512 + 64)
//                 + 512x(128 x 256), o (128 x 128)x7168 = 187,105,280 weights a block
//                 (the multi-token-prediction module, 14B, is not in the 671B)
ModelShape mixtral_8x7b();
ModelShape deepseek_v3();

// Whether block b (0-based) holds experts.
bool is_moe_block(const ModelShape& m, int64_t block);

// One block's MLP part on one tp rank: the dense MLP, or the router, this ep
// rank's experts and the shared experts.
int64_t mlp_params(const ModelShape& m, const Grid& g, int64_t block);
// Of those, the routed experts' (sharded over ep, reduced over expert-dp).
int64_t expert_params(const ModelShape& m, const Grid& g, int64_t block);
// The experts' data-parallel grid: each expert on dp / ep ranks, its expert-dp group; under HSDP
// (--dp-shard, ep inside a shard group) dp_shard / ep of them in each shard group, replicated as the rest.
Grid expert_dp_grid(const Grid& g);

// The rows one expert computes of a rank's `tokens` under a balanced router: N k / E, at most the
// capacity ceil(F N k / E) with --capacity-factor F (nn/moe_token_dispatcher.h; the slots past it dropped).
double balanced_expert_rows(const ModelShape& m, int64_t tokens);

// Parameters a token's forward multiplies by (both embeddings counted, as
// Mixtral's 12.9B does): the whole model for a dense one.
int64_t active_params(const ModelShape& m);
// The matmul weights a token uses in one block, averaged over the blocks
// (the dense first ones and the MoE ones): the FLOPs' 2 x this per token.
double active_block_matmul_params(const ModelShape& m);

// (ep - 1) alpha + (ep - 1)/ep x bytes / B: one all-to-all of `bytes` over n ranks.
double all_to_all_seconds(double bytes, int n, const Link& l);

// One micro-batch's dispatch and combine on pipeline rank `stage` (its MoE blocks).
GroupTraffic ep_per_micro_batch(const ModelShape& m, const Grid& g, const Batch& b, const Machine& mc, int stage);

}  // namespace loom::plan
