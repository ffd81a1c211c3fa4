// FullyShardedOptimizer: the optimizer step of ZeRO-3 (parallel/data_parallel/
// fully_sharded.h). Each dp rank steps only its shard of every unit - the fp32
// main param, exp_avg and exp_avg_sq of that shard - and rounds the result into
// the unit's model-dtype shard, which the next forward's all-gather reads.
// The math is MixedPrecisionOptimizer's (unscale and found_inf, the grad norm
// and clipping summed over every shard, AdamW); what differs is where things are:
//   the gradient   the unit's fp32 grad shard, reduce-scattered during backward
//   main params    one per (param ∩ this rank's shard), cut as ZeRO-1 cuts its
//                  buckets (param_range_in_shard), so param groups (weight
//                  decay) and checkpoints see the same (param, start, end) pieces
//   the update     into the unit's model-dtype shard (fp32: the main param *is*
//                  that shard, no copy); the full params are gathered again by
//                  the next forward's hooks, so there is no all-gather here
#pragma once

#include "optim/distributed_optimizer.h"
#include "parallel/data_parallel/fully_sharded.h"

namespace loom::optim {

class FullyShardedOptimizer : public MixedPrecisionOptimizer {
 public:
  // groups: the model's params, every one sharded by fsdp. options.grad_stats_group
  // defaults to fsdp's dp group (every shard once); with tp it must be the world.
  FullyShardedOptimizer(std::vector<ParamGroup> groups, parallel::FullyShardedDataParallel& fsdp,
                        MixedPrecisionOptions options = {});

  // Unscale/clip over every rank's shards, AdamW on this rank's, rounded into
  // the model-dtype shards. Collective over grad_stats_group.
  StepResult step() override;
  // Main params -> model-dtype shards (after a checkpoint's main params were loaded).
  void refresh_model_params() override;
  // Every unit gathered, for a reader outside forward (a checkpoint, the sample).
  // Not before each forward: each unit's forward pre-hook gathers its own.
  void finish_param_sync() override { fsdp_.unshard_all(); }
  void before_forward() override {}  // each unit is gathered by its own forward pre-hook
  parallel::ProcessGroup* shard_group() const override { return &fsdp_.dp_group(); }

 private:
  struct Piece {
    size_t unit = 0;
    Range shard;  // where main param i sits in its unit's shard
  };
  struct Layout {
    std::vector<MainParam> mains;
    std::vector<Piece> pieces;
  };
  FullyShardedOptimizer(std::vector<ParamGroup> groups, parallel::FullyShardedDataParallel& fsdp,
                        MixedPrecisionOptions options, Layout layout);
  static Layout build_layout(const std::vector<ParamGroup>& groups, parallel::FullyShardedDataParallel& fsdp);
  void copy_to_shard(size_t i);

  parallel::FullyShardedDataParallel& fsdp_;
  std::vector<Piece> pieces_;  // [main param]
};

}  // namespace loom::optim
