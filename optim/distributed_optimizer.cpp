#include "optim/distributed_optimizer.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "autograd/variable.h"
#include "parallel/trace/trace.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::optim {

ParamRange param_range_in_shard(int64_t param_start, int64_t numel, Range shard) {
  const int64_t start = std::max(param_start, shard.start);
  const int64_t end = std::min(param_start + numel, shard.end);
  if (start >= end) return {};
  Range world{start, end};
  return {world, {start - shard.start, end - shard.start}, {start - param_start, end - param_start}};
}

struct DistributedOptimizer::Layout {
  DType dtype = kFloat32;  // the model's
  std::vector<MainParam> mains;
  std::vector<ParamRange> ranges;
  std::vector<Tensor> shard_grads;
  Shards dense, experts;
};

MixedPrecisionOptions reduced_over_dp(MixedPrecisionOptions options, parallel::ProcessGroup& dp_group) {
  if (!options.grad_stats_group) options.grad_stats_group = &dp_group;
  return options;
}

DistributedOptimizer::DistributedOptimizer(std::vector<ParamGroup> groups, parallel::ZeroDataParallelBucket& dp,
                                           MixedPrecisionOptions options)
    : DistributedOptimizer(groups, dp, reduced_over_dp(std::move(options), dp.dp_group()), build_layout(groups, dp)) {}

DistributedOptimizer::DistributedOptimizer(std::vector<ParamGroup> groups, parallel::ZeroDataParallelBucket& dp,
                                           MixedPrecisionOptions options, Layout layout)
    : MixedPrecisionOptimizer(std::move(groups), std::move(layout.mains), std::move(options),
                              /*main_grad_of=*/nullptr),  // main_grad(i) reads the shard instead
      dp_(dp),
      ranges_(std::move(layout.ranges)),
      shard_grads_(std::move(layout.shard_grads)),
      dense_(std::move(layout.dense)),
      experts_(std::move(layout.experts)) {
  // The early steps follow the dense buckets' reductions only: not with experts in a buffer of their own.
  if (!experts_.grads && ZeroOverlap::applies(options_, dp_.sharded_buckets()))
    overlap_ = std::make_unique<ZeroOverlap>(*this, dp_);
  // Whether buckets may be stepped early depends on how each is reduced:
  // marking one all-reduce from now on is an error where it happens.
  dp_.sharded_buckets().fix_reductions("a DistributedOptimizer");
}

DistributedOptimizer::~DistributedOptimizer() {
  for (Shards* s : {&dense_, &experts_})
    for (auto& w : s->gathers)
      if (w) w->wait();  // the comm thread must not write into a freed buffer
}

DistributedOptimizer::Layout DistributedOptimizer::build_layout(const std::vector<ParamGroup>& groups,
                                                               parallel::ZeroDataParallelBucket& dp) {
  std::unordered_set<const TensorImpl*> grouped;
  for (const ParamGroup& g : groups)
    for (const Tensor& p : g.params) grouped.insert(p.impl());
  const std::vector<Tensor>& params = dp.params();
  LOOM_CHECK(!params.empty(), "DistributedOptimizer: no parameters that require grad");
  for (const Tensor& p : params) {
    LOOM_CHECK(p.dtype() == params.front().dtype(), "DistributedOptimizer: params of mixed dtypes (",
               dtype_name(params.front().dtype()), " and ", p.describe(), "); cast the model to one dtype first");
    LOOM_CHECK(grouped.count(p.impl()), "DistributedOptimizer: ", p.describe(), " is wrapped by the "
               "ZeroDataParallelBucket but is in no param group");
  }
  Layout layout;
  layout.dtype = params.front().dtype();
  lay_out(dp.sharded_buckets(), groups, layout, layout.dense);  // the dense params, over dp
  // Expert parallelism's experts, in their own buffer: the same, over their expert-dp group.
  if (parallel::ShardedBuckets* experts = dp.expert_shards()) lay_out(*experts, groups, layout, layout.experts);
  return layout;
}

void DistributedOptimizer::lay_out(parallel::ShardedBuckets& bm, const std::vector<ParamGroup>& groups,
                                   Layout& layout, Shards& shards) {
  std::unordered_map<const TensorImpl*, size_t> group_of;
  for (size_t g = 0; g < groups.size(); ++g)
    for (const Tensor& p : groups[g].params) group_of[p.impl()] = g;
  shards.grads = &bm;
  // 1. The param buffer: the gradient buffer's layout in the model's dtype; each
  //    param's values move into its slot and the param becomes a view of it
  //    (Megatron's param_data; PyTorch's `param.data = buffer[...]`).
  NoGradGuard no_grad;
  const DType dtype = layout.dtype;
  shards.params = zeros({bm.numel()}, dtype, bm.buffer().device());  // beside the grad buffer
  for (const parallel::Bucket& b : bm.buckets())
    for (const Tensor& p : b.params) {
      Tensor slot = ops::view(ops::narrow(shards.params, 0, bm.offset_of(p), p.numel()), p.shape());
      ops::copy_(slot, autograd::detach(p));
      ops::set_data(p, slot);
    }

  // 2. The ranges this rank owns, bucket by bucket, and a main param for each.
  shards.bucket_mains.resize(bm.buckets().size());
  shards.gathers.resize(bm.buckets().size());
  for (size_t b = 0; b < bm.buckets().size(); ++b) {
    parallel::ShardedBuckets::Shard shard = bm.shard(int(b));
    for (const Tensor& p : bm.buckets()[b].params) {
      ParamRange r = param_range_in_shard(bm.offset_of(p), p.numel(), {shard.offset, shard.offset + shard.numel});
      if (r.param.size() == 0) continue;
      Tensor owned = flat_range(autograd::detach(p), r.param.start, r.param.end);
      // fp32: the main param is the owned slice of the param buffer itself.
      Tensor main = dtype == kFloat32 ? owned : ops::to(owned, kFloat32);
      shards.bucket_mains[b].push_back(layout.mains.size());
      layout.mains.push_back({p, r.param.start, r.param.end, main, group_of.at(p.impl()), true});
      layout.ranges.push_back(r);
      // Its gradient: the owned range of this rank's shard of the bucket (under
      // ZeRO-1 a view into the whole buffer, under ZeRO-2 all that is kept).
      layout.shard_grads.push_back(ops::narrow(bm.shard_grad(int(b)), 0, r.gbuf_local.start, r.gbuf_local.size()));
    }
  }
}

StepResult DistributedOptimizer::step() {
  NoGradGuard no_grad;
  parallel::trace::Span span("optimizer step (sharded)");
  StepResult result;
  // Backward has reduce-scattered the buckets: main_grad(i) is the dp average
  // of owned range i.
  std::vector<Tensor> grads(mains_.size());
  for (size_t i = 0; i < mains_.size(); ++i) grads[i] = main_grad(i);
  if (overlap_ && overlap_->take_all_stepped()) {
    unscale_and_clip(grads, result);  // stepped during backward; no scaling, no clipping: the norm is reported
    return result;
  }
  if (!unscale_and_clip(grads, result)) return result;  // skipped: params unchanged, nothing to gather
  // Last bucket first: it holds the first layers (buckets are in reverse
  // module order), so its all-gather, first in the dp group's queue, is done
  // first, for the next forward to read (param_gather_overlap.h).
  for (int b = int(dense_.bucket_mains.size()) - 1; b >= 0; --b) step_bucket(dense_, b);
  // The experts' shards, gathered over their expert-dp group (another queue than dp's).
  for (int b = int(experts_.bucket_mains.size()) - 1; b >= 0; --b) step_bucket(experts_, b);
  return result;
}

void DistributedOptimizer::step_bucket(Shards& s, int b) {
  parallel::trace::Span span(str(&s == &experts_ ? "step expert bucket " : "step bucket ", b));
  if (s.gathers[size_t(b)]) s.gathers[size_t(b)]->wait();  // the last gather of b still reads this shard
  for (size_t i : s.bucket_mains[size_t(b)]) {
    adam_step(i, main_grad(i));  // main_grad(i): the grads unscaled and clipped in place
    copy_to_model(i);            // round into this rank's shard of the param buffer
  }
  launch_all_gather(s, b);
}

void DistributedOptimizer::launch_all_gather(Shards& s, int b) {
  // Every rank's updated shard -> the whole bucket, in place in the param buffer.
  const parallel::Bucket& bucket = s.grads->buckets()[size_t(b)];
  parallel::ShardedBuckets::Shard mine = s.grads->shard(b);
  s.gathers[size_t(b)] = s.grads->group().all_gather_async(ops::narrow(s.params, 0, bucket.offset, bucket.numel),
                                                           ops::narrow(s.params, 0, mine.offset, mine.numel));
}

void DistributedOptimizer::finish_param_sync() {
  parallel::trace::Span span("wait for param all-gather");
  for (Shards* s : {&dense_, &experts_})
    for (auto& w : s->gathers) {
      if (w) w->wait();
      w = nullptr;
    }
}

void DistributedOptimizer::overlap_param_gather(const std::vector<std::shared_ptr<nn::Layer>>& layers) {
  LOOM_CHECK(!gather_overlap_, "DistributedOptimizer::overlap_param_gather: already on");
  gather_overlap_ = std::make_unique<ParamGatherOverlap>(*this, layers);
}

void DistributedOptimizer::wait_param_gather(int b, bool experts) {
  std::shared_ptr<parallel::Work>& w = (experts ? experts_ : dense_).gathers.at(size_t(b));
  if (!w) return;
  parallel::trace::Span span(str(experts ? "wait for expert param all-gather " : "wait for param all-gather ", b));
  w->wait();
  w = nullptr;
}

void DistributedOptimizer::refresh_model_params() {
  finish_param_sync();
  for (Shards* s : {&dense_, &experts_})
    for (size_t b = 0; b < s->bucket_mains.size(); ++b) {
      for (size_t i : s->bucket_mains[b]) copy_to_model(i);
      launch_all_gather(*s, int(b));
    }
  finish_param_sync();
}

}  // namespace loom::optim
