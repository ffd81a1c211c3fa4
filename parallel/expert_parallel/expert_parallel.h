// Where expert parallelism sits in the grid, and what it changes in the model.
// The ep group is ep consecutive ranks of the data-parallel group (Megatron:
// dp is cut into ep groups; the ranks that hold the same experts, one per ep
// group, form the expert-data-parallel group of dp / ep ranks), e.g. dp 4, ep 2:
//     dp ranks   0 1 | 2 3        ep groups {0,1} {2,3}   (process_group_manager.h builds both)
//     experts    0-1 2-3 | 0-1 2-3   expert-dp groups {0,2} {1,3}
// Each rank keeps only its E / ep experts of every MoE layer (their names keep
// the global index: blocks.N.moe.experts.2.w1.weight on ep rank 1 of E 4, ep 2),
// and each MoE layer's expert step becomes dispatch -> compute -> combine
// (token_dispatcher_all_to_all.h). What follows from holding E / ep experts:
//   gradients     an expert's gradient on its rank already sums the tokens of the
//                 ep group's micro-batches; the expert-dp group sums the rest.
//                 Megatron scales it by 1 / dp, as every other gradient
//                 (data_parallel_common.h's ExpertParams: Avg over expert-dp x 1 / ep)
//   grad norm     each expert counted once: summed over the ep group, the
//                 replicated params counted on ep rank 0 only (finalize_model_grads.h)
//   ZeRO-1/2      the experts' buffer is reduce-scattered over expert-dp and
//                 their optimizer state sharded over it (optim/distributed_optimizer.h)
//   ZeRO-3        each block's experts one unit cut over expert-dp; under HSDP
//                 (--dp-shard) over its ranks inside the shard group, the grad
//                 shards averaged over the replicas (fully_sharded.h)
//   checkpoints   the model file gathers every expert (gather_experts); each ep
//                 rank of expert-dp rank 0 writes its experts' optimizer state
//                 (under ZeRO every rank its shard), by global name, so ep 2
//                 resumes at ep 1 and back (optim/checkpoint.h)
#pragma once

#include <vector>

#include "nn/module.h"
#include "parallel/comm/process_group.h"
#include "parallel/data_parallel/data_parallel_common.h"
#include "parallel/process_group_manager.h"

namespace loom::parallel {

// Keeps only ep.rank()'s E / ep experts of every MoE layer under model (the
// others are freed) and sets its expert step to dispatch_compute_combine over
// ep (which must outlive model). Errors when ep does not divide E.
void use_expert_parallel(nn::Module& model, ProcessGroup& ep);

// The routed experts' params under model (nn/moe.h's MoE::experts), in module order:
// under ep, this rank's, reduced over the expert-dp group.
std::vector<Tensor> expert_params(nn::Module& model);

// What the data-parallel wrapper keeps apart (data_parallel_common.h): model's
// experts over pgm's expert-dp group (HSDP: its ranks in this rank's shard
// group, expert_dp_shard_cp_group), scaled by 1 / ep. Empty when ep = 1.
ExpertParams expert_data_parallel_params(nn::Module& model, ProcessGroupManager& pgm);

// state: this rank's named state (nn::Module::state_dict order), holding its
// experts; returns it with every ep rank's experts, each layer's in global
// order where its local ones were. Collective over ep (an all-gather per
// expert tensor). model gives which names are experts.
nn::NamedTensors gather_experts(nn::Module& model, const nn::NamedTensors& state, ProcessGroup& ep);

}  // namespace loom::parallel
