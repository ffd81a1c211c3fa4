#include "optim/build_optimizer.h"

#include "optim/distributed_optimizer.h"
#include "optim/fully_sharded_optimizer.h"
#include "optim/param_groups.h"

namespace loom::optim {

std::unique_ptr<MixedPrecisionOptimizer> build_optimizer(parallel::Model& model, const parallel::DataParallelWrap& dp,
                                                         const parallel::FinalizeModelGrads& finalize,
                                                         const OptimizerOptions& o) {
  MixedPrecisionOptions mp;
  mp.max_grad_norm = o.max_grad_norm;
  mp.loss_scaling = o.loss_scaling;
  mp.scaler = o.scaler;
  mp.grad_mean_ranks = o.grad_mean_ranks;
  mp.grad_stats_group = finalize.grad_stats_group(o.zero > 0);
  mp.not_counted = finalize.not_counted(o.zero > 0);
  std::vector<ParamGroup> groups = gpt_param_groups(*model.chunks, o.lr, o.weight_decay);
  if (o.zero == 3) {
    LOOM_CHECK(dp.fsdp, "build_optimizer: ZeRO-3 steps the units' shards; wrap the model in FullyShardedDataParallel");
    return std::make_unique<FullyShardedOptimizer>(groups, *dp.fsdp, mp);
  }
  if (o.zero) {
    LOOM_CHECK(dp.zero, "build_optimizer: ZeRO shards the main_grad buffer; wrap the model in ZeroDataParallelBucket");
    auto zero = std::make_unique<DistributedOptimizer>(groups, *dp.zero, mp);
    // Each layer's forward pre-hook waits for its own buckets' all-gathers (param_gather_overlap.h).
    if (o.overlap_param_gather) zero->overlap_param_gather(model.chunks->layers());
    return zero;
  }
  Optimizer::GradSource main_grad;
  if (parallel::DataParallelBucket* b = dp.bucket) main_grad = [b](const Tensor& p) { return b->main_grad(p); };
  return std::make_unique<MixedPrecisionOptimizer>(groups, mp, main_grad);
}

}  // namespace loom::optim
