#include "optim/fully_sharded_optimizer.h"

#include <unordered_map>

#include "parallel/trace/trace.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::optim {

FullyShardedOptimizer::FullyShardedOptimizer(std::vector<ParamGroup> groups, parallel::FullyShardedDataParallel& fsdp,
                                             MixedPrecisionOptions options)
    : FullyShardedOptimizer(groups, fsdp, reduced_over_dp(std::move(options), fsdp.dp_group()),
                            build_layout(groups, fsdp)) {}

FullyShardedOptimizer::FullyShardedOptimizer(std::vector<ParamGroup> groups, parallel::FullyShardedDataParallel& fsdp,
                                             MixedPrecisionOptions options, Layout layout)
    : MixedPrecisionOptimizer(std::move(groups), std::move(layout.mains), std::move(options), nullptr),
      fsdp_(fsdp),
      pieces_(std::move(layout.pieces)) {}

FullyShardedOptimizer::Layout FullyShardedOptimizer::build_layout(const std::vector<ParamGroup>& groups,
                                                                  parallel::FullyShardedDataParallel& fsdp) {
  NoGradGuard no_grad;
  std::unordered_map<const TensorImpl*, size_t> group_of;
  for (size_t g = 0; g < groups.size(); ++g)
    for (const Tensor& p : groups[g].params) group_of[p.impl()] = g;
  size_t sharded = 0;
  Layout layout;
  for (size_t u = 0; u < fsdp.units().size(); ++u) {
    const parallel::FullyShardedDataParallel::Unit& unit = fsdp.units()[u];
    if (unit.params.empty()) continue;
    const int64_t n = unit.shard.numel(), rank = unit.group->rank();  // dp's, or the experts' expert-dp's
    for (size_t k = 0; k < unit.params.size(); ++k) {
      const Tensor& p = unit.params[k];
      LOOM_CHECK(group_of.count(p.impl()), "FullyShardedOptimizer: ", p.describe(), " is sharded but in no param group");
      ++sharded;
      // The part of p in this rank's shard [rank n, (rank + 1) n) of the unit's flat buffer.
      ParamRange r = param_range_in_shard(unit.offsets[k], p.numel(), {rank * n, (rank + 1) * n});
      if (r.param.size() == 0) continue;
      Tensor owned = ops::narrow(unit.shard, 0, r.gbuf_local.start, r.gbuf_local.size());
      Tensor main = owned.dtype() == kFloat32 ? owned : ops::to(owned, kFloat32);  // fp32: the shard itself
      layout.mains.push_back({p, r.param.start, r.param.end, main, group_of.at(p.impl()), true});
      layout.pieces.push_back({u, r.gbuf_local});
    }
  }
  LOOM_CHECK(sharded == group_of.size(), "FullyShardedOptimizer: the param groups hold ", group_of.size(),
             " params, FullyShardedDataParallel shards ", sharded);
  return layout;
}

StepResult FullyShardedOptimizer::step() {
  NoGradGuard no_grad;
  parallel::trace::Span span("optimizer step (fully sharded)");
  fsdp_.reshard_all();  // params gathered for a reader outside forward go stale with this update
  StepResult result;
  // Backward reduce-scattered each unit: the grad shard holds the dp average of this rank's part.
  std::vector<Tensor> grads(mains_.size());
  for (size_t i = 0; i < mains_.size(); ++i)
    grads[i] = ops::narrow(fsdp_.units()[pieces_[i].unit].grad_shard, 0, pieces_[i].shard.start, pieces_[i].shard.size());
  if (!unscale_and_clip(grads, result)) return result;  // skipped: shards unchanged
  for (size_t i = 0; i < mains_.size(); ++i) {
    adam_step(i, grads[i]);
    copy_to_shard(i);
  }
  return result;
}

void FullyShardedOptimizer::copy_to_shard(size_t i) {
  Tensor dst = ops::narrow(fsdp_.units()[pieces_[i].unit].shard, 0, pieces_[i].shard.start, pieces_[i].shard.size());
  if (dst.storage() == mains_[i].main.storage() && dst.offset() == mains_[i].main.offset()) return;  // fp32: the same memory
  ops::copy_(dst, mains_[i].main);  // rounds to nearest even for bf16/fp16
}

void FullyShardedOptimizer::refresh_model_params() {
  NoGradGuard no_grad;
  fsdp_.reshard_all();
  for (size_t i = 0; i < mains_.size(); ++i) copy_to_shard(i);
}

}  // namespace loom::optim
