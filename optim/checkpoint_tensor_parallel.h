// The optimizer state of a tensor-parallel run in a checkpoint. A tp rank's
// main params are shards of the model's tensors (cut by rules of their own:
// rows, columns, heads regrouped, a padded vocabulary), so their elements do
// not form ranges of the full tensor. The checkpoint stays the one format of
// checkpoint.h, whatever tp: on save the shards are joined into full tensors
// ("main/<name>/0" holding every element), on load each rank cuts its shard
// back out (parallel/tensor_parallel/shard_map.h). So a run saved at tp 2
// resumes at tp 1, at tp 4 or at dp 2 x tp 2, and a tp = 1 checkpoint
// resumes under tp.
//
// Joining: every rank places the elements of its main params at their full
// positions in one flat float64 buffer [sum over params of 3 x (numel + 1)],
// zeros elsewhere; a sum over tp (and, under ZeRO, over dp, whose ranks own
// disjoint ranges) joins them. Replicated params are placed by tp rank 0 only,
// replicas without ZeRO by dp rank 0 only, so every element is one value plus zeros.
// Under expert parallelism the ep ranks of one dp group hold other experts in
// the same slots (blocks.1.moe.experts.0 on ep rank 0, .2 on ep rank 1), so a
// sum over dp would add them up: the experts are joined in a buffer of their
// own, over the ranks holding the same ones (expert-dp x cp, where ZeRO shards
// them), and each ep rank's tp rank 0 of expert-dp rank 0 returns its experts.
#pragma once

#include <string>
#include <vector>

#include "nn/module.h"
#include "optim/mixed_precision_optimizer.h"
#include "parallel/comm/process_group.h"
#include "parallel/tensor_parallel/shard_map.h"

namespace loom::optim {

struct TensorParallelShards {
  const parallel::ShardMaps* maps;  // by parameter name: every param of this rank
  parallel::ProcessGroup* tp;
  // The ranks of this (pp, tp) coordinate that hold its optimizer state: the
  // group ZeRO shards over (MixedPrecisionOptimizer::shard_group(): dp x cp),
  // or the replicas. A cp rank owns ranges too: the dp group alone would miss them.
  parallel::ProcessGroup* dp;
  bool zero;  // the optimizer is sharded over dp (ZeRO)
  // --ep: the routed experts (whole on every tp rank, other ones on each ep rank), joined over
  // expert_dp (pgm.expert_dp_group(): their replicas, or under ZeRO their shards) instead of dp.
  std::vector<Tensor> experts = {};
  parallel::ProcessGroup* expert_dp = nullptr;
};

// Collective over tp and dp (and expert_dp). Returns, on tp rank 0 of dp rank 0,
// this stage's optimizer state as full tensors (fp32, flat): main/<name>/0,
// exp_avg/<name>/0, exp_avg_sq/<name>/0 and step/<name>/0 (under ep, the
// experts' on tp rank 0 of each expert_dp rank 0 instead); elsewhere nothing.
nn::NamedTensors full_optimizer_fragments(const MixedPrecisionOptimizer& opt, const nn::NamedTensors& params,
                                          const TensorParallelShards& tp);

// One saved piece of a (kind, param): elements [start, start + t.numel()) of the flattened param.
struct OptimizerFragment {
  int64_t start;
  Tensor t;
  std::string file;
};

// The whole flat [numel] tensor of one (kind, param) from its fragments (which
// may overlap: a tied weight's two copies). Error naming `what` and `index_path`
// if some element is in no fragment.
Tensor join_fragments(const std::vector<OptimizerFragment>& fragments, int64_t numel, const std::string& what,
                      const std::string& index_path);

}  // namespace loom::optim
