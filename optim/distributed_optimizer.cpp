#include "optim/distributed_optimizer.h"

#include <algorithm>
#include <unordered_map>

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
  Tensor param_buffer;
  std::vector<MainParam> mains;
  std::vector<ParamRange> ranges;
  std::vector<std::vector<size_t>> bucket_mains;
};

namespace {

// Each dp rank holds 1/dp of every gradient, so the norm and found_inf are sums
// over at least the dp group: left per rank, ranks would clip by different
// factors, and a rank that alone finds an inf would skip its all-gathers while
// the others launch theirs (a hang). A pipeline passes the whole world.
MixedPrecisionOptions reduced_over_dp(MixedPrecisionOptions options, parallel::DataParallelBucket& dp) {
  if (!options.grad_stats_group) options.grad_stats_group = &dp.dp_group();
  return options;
}

}  // namespace

DistributedOptimizer::DistributedOptimizer(std::vector<ParamGroup> groups, parallel::DataParallelBucket& dp,
                                           MixedPrecisionOptions options)
    : DistributedOptimizer(groups, dp, reduced_over_dp(std::move(options), dp), build_layout(groups, dp)) {}

DistributedOptimizer::DistributedOptimizer(std::vector<ParamGroup> groups, parallel::DataParallelBucket& dp,
                                           MixedPrecisionOptions options, Layout layout)
    : MixedPrecisionOptimizer(std::move(groups), std::move(layout.mains), std::move(options),
                              [&dp](const Tensor& p) { return dp.main_grad(p); }),
      dp_(dp),
      param_buffer_(std::move(layout.param_buffer)),
      ranges_(std::move(layout.ranges)),
      bucket_mains_(std::move(layout.bucket_mains)),
      gathers_(bucket_mains_.size()) {
  // Nothing global (norm, found_inf) stands between a bucket's reduction and
  // its update: step it from the DDP callback, overlapping later buckets'
  // reduce-scatters. Buckets all-reduced for the shared-weight handler wait for
  // it, so early steps are off when there are any.
  bool all_scattered = true;
  for (const parallel::Bucket& b : dp_.bucket_manager().buckets()) all_scattered &= !b.all_reduce;
  steps_early_ = options_.max_grad_norm == 0 && !options_.loss_scaling && all_scattered;
  // Marking a bucket all-reduce later would have it stepped before the
  // shared-weight handler runs: make that an error where it happens.
  dp_.bucket_manager().fix_reductions("a DistributedOptimizer");
  if (steps_early_) {
    std::weak_ptr<bool> alive = alive_;
    dp_.set_on_bucket_reduced([this, alive](int b) {
      if (alive.expired()) return;
      std::vector<Tensor> grads(mains_.size());
      for (size_t i : bucket_mains_[size_t(b)]) grads[i] = main_grad(i);
      step_bucket(b, grads);
      ++buckets_stepped_early_;
    });
  }
}

DistributedOptimizer::~DistributedOptimizer() {
  alive_.reset();
  if (steps_early_) dp_.set_on_bucket_reduced(nullptr);
  for (auto& w : gathers_)
    if (w) w->wait();  // the comm thread must not write into a freed buffer
}

DistributedOptimizer::Layout DistributedOptimizer::build_layout(const std::vector<ParamGroup>& groups,
                                                               parallel::DataParallelBucket& dp) {
  parallel::BucketManager& bm = dp.bucket_manager();
  LOOM_CHECK(bm.reduce() == parallel::GradReduce::ReduceScatter, "DistributedOptimizer: the DataParallelBucket must "
             "reduce-scatter (BucketOptions::reduce = GradReduce::ReduceScatter); it all-reduces");
  DistributedOptimizer::Layout layout;
  std::unordered_map<const TensorImpl*, size_t> group_of;
  for (size_t g = 0; g < groups.size(); ++g)
    for (const Tensor& p : groups[g].params) group_of[p.impl()] = g;

  // 1. The param buffer: the gradient buffer's layout in the model's dtype; each
  //    param's values move into its slot and the param becomes a view of it
  //    (Megatron's param_data; PyTorch's `param.data = buffer[...]`).
  NoGradGuard no_grad;
  const std::vector<Tensor>& params = dp.params();
  LOOM_CHECK(!params.empty(), "DistributedOptimizer: no parameters that require grad");
  const DType dtype = params.front().dtype();
  for (const Tensor& p : params)
    LOOM_CHECK(p.dtype() == dtype, "DistributedOptimizer: params of mixed dtypes (", dtype_name(dtype), " and ",
               p.describe(), "); cast the model to one dtype first");
  layout.param_buffer = zeros(bm.buffer().shape(), dtype);
  for (const Tensor& p : params) {
    LOOM_CHECK(group_of.count(p.impl()), "DistributedOptimizer: ", p.describe(), " is wrapped by the "
               "DataParallelBucket but is in no param group");
    Tensor slot = ops::view(ops::narrow(layout.param_buffer, 0, bm.offset_of(p), p.numel()), p.shape());
    ops::copy_(slot, autograd::detach(p));
    ops::set_data(p, slot);
  }

  // 2. The ranges this rank owns, bucket by bucket, and a main param for each.
  layout.bucket_mains.resize(bm.buckets().size());
  for (size_t b = 0; b < bm.buckets().size(); ++b) {
    parallel::BucketManager::Shard shard = bm.shard(int(b));
    for (const Tensor& p : bm.buckets()[b].params) {
      ParamRange r = param_range_in_shard(bm.offset_of(p), p.numel(), {shard.offset, shard.offset + shard.numel});
      if (r.param.size() == 0) continue;
      Tensor owned = flat_range(autograd::detach(p), r.param.start, r.param.end);
      // fp32: the main param is the owned slice of the param buffer itself.
      Tensor main = dtype == kFloat32 ? owned : ops::to(owned, kFloat32);
      layout.bucket_mains[b].push_back(layout.mains.size());
      layout.mains.push_back({p, r.param.start, r.param.end, main, group_of.at(p.impl()), true});
      layout.ranges.push_back(r);
    }
  }
  return layout;
}

void DistributedOptimizer::launch_all_gather(int b) {
  // Every rank's updated shard -> the whole bucket, in place in the param buffer.
  const parallel::Bucket& bucket = dp_.bucket_manager().buckets()[size_t(b)];
  parallel::BucketManager::Shard s = dp_.bucket_manager().shard(b);
  gathers_[size_t(b)] = dp_.dp_group().all_gather_async(ops::narrow(param_buffer_, 0, bucket.offset, bucket.numel),
                                                        ops::narrow(param_buffer_, 0, s.offset, s.numel));
}

void DistributedOptimizer::step_bucket(int b, const std::vector<Tensor>& grads) {
  parallel::trace::Span span(str("step bucket ", b));
  const std::vector<size_t>& mains = bucket_mains_[size_t(b)];
  if (gathers_[size_t(b)]) gathers_[size_t(b)]->wait();
  adam_step(mains, grads);
  copy_to_model(mains);  // round into this rank's shard of the param buffer
  launch_all_gather(b);
}

StepResult DistributedOptimizer::step() {
  NoGradGuard no_grad;
  parallel::trace::Span span("optimizer step (sharded)");
  StepResult result;
  std::vector<Tensor> grads(mains_.size());
  for (size_t i = 0; i < mains_.size(); ++i) grads[i] = main_grad(i);
  if (steps_early_) {
    // Already stepped in the backward callback; the norm is only reported.
    const int stepped = buckets_stepped_early_;
    buckets_stepped_early_ = 0;
    if (stepped == int(bucket_mains_.size())) {
      unscale_and_clip(grads, result);
      return result;
    }
    LOOM_CHECK(stepped == 0, "DistributedOptimizer::step: only ", stepped, " of ", bucket_mains_.size(),
               " buckets were stepped during backward");
  }
  if (!unscale_and_clip(grads, result)) return result;  // skipped: params unchanged, nothing to gather
  for (size_t b = 0; b < bucket_mains_.size(); ++b) step_bucket(int(b), grads);
  return result;
}

void DistributedOptimizer::finish_param_sync() {
  parallel::trace::Span span("wait for param all-gather");
  for (auto& w : gathers_) {
    if (w) w->wait();
    w = nullptr;
  }
}

void DistributedOptimizer::refresh_model_params() {
  finish_param_sync();
  for (size_t b = 0; b < bucket_mains_.size(); ++b) {
    copy_to_model(bucket_mains_[b]);
    launch_all_gather(int(b));
  }
  finish_param_sync();
}

}  // namespace loom::optim
