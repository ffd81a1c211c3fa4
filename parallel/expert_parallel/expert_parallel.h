// Where expert parallelism sits in the grid, and what it changes in the model.
// The ep group is ep consecutive ranks of the data-parallel group (Megatron:
// dp is cut into ep groups; the ranks that hold the same experts, one per ep
// group, form the expert-data-parallel group of dp / ep ranks), e.g. dp 4, ep 2:
//     dp ranks   0 1 | 2 3        ep groups {0,1} {2,3}
//     experts    0-1 2-3 | 0-1 2-3   expert-dp groups {0,2} {1,3}
// Each ep group splits the experts' compute E / ep per rank: every MoE layer's
// expert step becomes dispatch -> compute -> combine (token_dispatcher_all_to_all.h).
// Every rank keeps all E experts' weights for now (the memory is not split
// yet), so the gradients, the grad norm, the optimizer and checkpoints are
// data parallel's, unchanged.
#pragma once

#include <memory>

#include "nn/module.h"
#include "parallel/comm/process_group.h"

namespace loom::parallel {

// Collective over dp: the group of ep consecutive dp ranks holding this rank (dp % ep == 0).
std::unique_ptr<ProcessGroup> make_ep_group(ProcessGroup& dp, int ep);

// Sets every MoE layer's expert step under model to dispatch_compute_combine over ep (which must outlive model).
void use_expert_parallel(nn::Module& model, ProcessGroup& ep);

}  // namespace loom::parallel
