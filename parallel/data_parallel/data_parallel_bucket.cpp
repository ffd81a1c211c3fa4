#include "parallel/data_parallel/data_parallel_bucket.h"

#include "autograd/engine.h"
#include "autograd/variable.h"
#include "parallel/data_parallel/tp_partial_grads.h"
#include "parallel/trace/trace.h"
#include "tensor/ops.h"

namespace loom::parallel {

DataParallelBucket::DataParallelBucket(const NamedParams& params, ProcessGroup& dp_group, BucketOptions options,
                                       ExpertParams experts)
    : dp_group_(dp_group), options_(options) {
  if (options_.reduce != GradReduce::AllReduce) options_.grads_to_params = false;
  std::vector<Tensor> all = unique_params(params), dense, expert;
  for (const Tensor& p : all) (experts.group && experts.holds(p) ? expert : dense).push_back(p);
  broadcast_params(dense, dp_group_);  // every replica starts from dp rank 0's weights
  if (experts.group) broadcast_params(expert, *experts.group);  // the experts' replicas, from their group's rank 0
  for (const Tensor& p : all)
    if (autograd::requires_grad(p)) params_.push_back(p);
  std::vector<Tensor> grads_dense;
  for (const Tensor& p : dense)
    if (autograd::requires_grad(p)) grads_dense.push_back(p);
  buckets_ = make_buckets(options_.reduce, grads_dense, dp_group_, options_.bucket_cap_mb, &sharded_);
  if (experts.group) {  // the experts' buffer: averaged over expert-dp (ZeRO: sharded over it), times 1 / ep before
    for (const Tensor& p : expert) expert_impls_.insert(p.impl());
    expert_buckets_ = make_buckets(options_.reduce, expert, *experts.group, options_.bucket_cap_mb, &expert_shards_);
    scale_experts_ = [this, scale = experts.grad_scale](int b) {
      const Tensor& g = expert_buckets_->buckets()[size_t(b)].grad_data;
      if (g.defined()) ops::mul_(g, scale);  // ZeRO-2: undefined when no gradient reached it (zeros are reduced)
    };
    expert_buckets_->set_before_reduce(scale_experts_);
  }
  for (const Tensor& p : params_)
    hooks_.push_back(autograd::grad_accumulator(p)->register_hook([this](Tensor& g) { on_grad_accumulated(g); }));
}

void DataParallelBucket::sum_tp_partial_grads_before_reduce(std::vector<Tensor> partial, ProcessGroup& tp_group) {
  // The experts are whole on every tp rank: under sequence parallelism their gradients are partial sums too.
  if (expert_buckets_)
    parallel::sum_tp_partial_grads_before_reduce(*expert_buckets_, partial, tp_group, scale_experts_);
  parallel::sum_tp_partial_grads_before_reduce(*buckets_, std::move(partial), tp_group);
  sums_tp_partial_grads_ = true;
}

void DataParallelBucket::on_grad_accumulated(const Tensor& param) {
  // 1. picotron: param.main_grad.add_(param.grad.data); param.grad = None.
  move_grad_to_main_grad(param);
  // no_sync: just accumulate - except under ZeRO-2, whose shards sum every micro-batch's reduce-scatter.
  const bool sync = require_backward_grad_sync_;
  if (!sync && !buckets_of(param).reduces_every_micro_batch(param)) return;
  // 2. After this backward, wait for the buckets (queued once per backward; the engine runs it
  //    before backward() returns, so `this` is still there), unless defer_grad_sync() is on.
  if (!callback_queued_ && (finish_sync_in_backward_ || !sync)) {
    autograd::Engine::queue_callback([this, sync] {
      if (sync) return finish_grad_sync();
      callback_queued_ = false;
      buckets_->finish_micro_batch();
      if (expert_buckets_) expert_buckets_->finish_micro_batch();
    });
    callback_queued_ = true;
  }
  // 3. The bucket's all-reduce starts once all its params are ready.
  buckets_of(param).mark_param_ready(param);
}

void DataParallelBucket::move_grad_to_main_grad(const Tensor& param) {
  // After a sync an fp32 param's .grad *is* its main_grad: a backward now would add into the average.
  LOOM_CHECK(!synced_, "DataParallelBucket: backward after the gradients were synced, without reset() in between; "
             "call dp.reset() once per optimizer step (it zeroes main_grad and drops .grad)");
  Tensor g = autograd::grad(param);
  if (g.defined()) ops::add_(buckets_of(param).main_grad_to_fill(param), ops::to(g, kFloat32));
  autograd::set_grad(param, Tensor());
}

void DataParallelBucket::finish_grad_sync() {
  callback_queued_ = false;
  if (synced_) return;
  {
    trace::Span span("wait for gradient all-reduce");  // the exposed communication
    buckets_->wait(on_bucket_reduced_);
    if (expert_buckets_) expert_buckets_->wait();
  }
  if (options_.grads_to_params) {  // picotron: param.grad = param.main_grad
    for (const Tensor& p : params_) {
      const Tensor main_grad = buckets_of(p).main_grad(p);
      autograd::set_grad(p, p.dtype() == kFloat32 ? main_grad : ops::to(main_grad, p.dtype()));
    }
  }
  synced_ = true;
}

void DataParallelBucket::reset() {
  buckets_->reset();
  if (expert_buckets_) expert_buckets_->reset();
  autograd::zero_grad(params_, /*set_to_none=*/true);
  callback_queued_ = false;
  synced_ = false;
}

void DataParallelBucket::grad_changed(const Tensor& param) {
  if (options_.grads_to_params && param.dtype() != kFloat32)
    autograd::set_grad(param, ops::to(buckets_of(param).main_grad(param), param.dtype()));
}

ShardedBuckets& DataParallelBucket::sharded_buckets() {
  LOOM_CHECK(sharded_, "DataParallelBucket: its buckets are all-reduced (BucketOptions::reduce = "
             "GradReduce::AllReduce); only ReduceScatter and ShardGrads keep shards");
  return *sharded_;
}

bool DataParallelBucket::holds_whole_grad(const Tensor& param) const {
  const BucketManager& bm = buckets_of(param);
  return bm.buckets()[size_t(bm.bucket_of(param))].all_reduce;
}

}  // namespace loom::parallel
