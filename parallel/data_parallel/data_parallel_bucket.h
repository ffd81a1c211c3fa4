// DataParallelBucket: data parallelism whose gradient all-reduces overlap
// backward (picotron's DataParallelBucket; Megatron's DistributedDataParallel
// with overlap_grad_reduce; PyTorch DDP's reducer). A backward pass (bucket.h
// for the buffer):
//   1. A hook on each parameter's AccumulateGrad node adds .grad into the
//      param's fp32 main_grad (a view into the bucket buffer), drops .grad and
//      marks the param ready; the first hook of the pass queues a callback on
//      the autograd engine.
//   2. When every param of a bucket is ready, the bucket's all-reduce (average
//      over dp) is launched asynchronously; backward goes on with earlier layers.
//   3. The callback (or, under defer_grad_sync(), the caller: a pipeline
//      schedule after its last send_backward) waits for every bucket and hands
//      the average back as .grad: an fp32 param's .grad *is* its main_grad
//      (picotron's `param.grad = param.main_grad`), a bf16/fp16 param's a
//      rounded copy (a mixed-precision optimizer reads main_grad instead).
// ZeRO-1 and ZeRO-2 reduce-scatter the buckets instead (GradReduce, grad_shards.h);
// the experts get a buffer of their own, over their expert-dp group (ExpertParams),
// scaled by 1 / ep and all-reduced (or under ZeRO-1/2 reduce-scattered) there.
//
//   DataParallelBucket dp(model.named_parameters(), pgm.dp_group(), {.bucket_cap_mb = 25});
//   for (step...) {
//     for (micro-batches but the last) { auto guard = dp.no_sync(); backward(loss / K); }
//     backward(loss / K);   // syncs the sum of all micro-batches
//     optimizer.step();
//     dp.reset();           // zero main_grad, drop .grad: once per step
//   }
#pragma once

#include <functional>
#include <memory>
#include <unordered_set>

#include "autograd/accumulate_grad.h"
#include "parallel/data_parallel/data_parallel_common.h"
#include "parallel/data_parallel/grad_shards.h"

namespace loom::parallel {

struct BucketOptions {
  double bucket_cap_mb = 25.0;
  // ReduceScatter (ZeRO-1) and ShardGrads (ZeRO-2) keep this rank's shard of
  // each bucket's average (grad_shards.h) and hand back no .grad.
  GradReduce reduce = GradReduce::AllReduce;
  // Off when the optimizer reads main_grad itself (optim/mixed_precision_optimizer.h):
  // bf16/fp16 params then get no rounded .grad copies.
  bool grads_to_params = true;
};

class DataParallelBucket : public DataParallel {
 public:
  // Broadcasts the params from dp rank 0 (collective over dp_group), lays out
  // the buffer, hooks every param that requires grad; destroying it unhooks them.
  // experts: kept apart, over their own group, reduced as options.reduce says.
  DataParallelBucket(const NamedParams& params, ProcessGroup& dp_group, BucketOptions options = {},
                     ExpertParams experts = {});
  DataParallelBucket(const DataParallelBucket&) = delete;
  DataParallelBucket& operator=(const DataParallelBucket&) = delete;

  // The fp32 gradient of param: a view into the bucket buffer.
  Tensor main_grad(const Tensor& param) const { return buckets_of(param).main_grad(param); }

  // Gradient accumulation: inside the guard backward only adds into main_grad.
  [[nodiscard]] NoSyncGuard no_sync() override { return NoSyncGuard(require_backward_grad_sync_); }
  void zero_grad() override { reset(); }
  bool syncs_once_per_step() const override { return true; }
  Tensor grad_of(const Tensor& param) const override { return main_grad(param); }
  void grad_changed(const Tensor& param) override;  // rounds a bf16/fp16 .grad again
  bool holds_whole_grad(const Tensor& param) const override;  // false in a ZeRO-1/2 shard
  bool sums_tp_partial_grads() const override { return sums_tp_partial_grads_; }
  // Sequence parallelism under ZeRO: these params' gradients are summed over tp as their bucket's
  // reduction is launched, while they are whole (tp_partial_grads.h).
  void sum_tp_partial_grads_before_reduce(std::vector<Tensor> partial, ProcessGroup& tp_group);
  bool require_backward_grad_sync() const { return require_backward_grad_sync_; }
  // Whether param is one of the ExpertParams, in their own buffer (not in bucket_manager()'s).
  bool kept_apart(const Tensor& param) const { return expert_buckets_ && expert_impls_.count(param.impl()); }

  // Zeroes every main_grad and drops every .grad: once per optimizer step (Megatron's zero_grad_buffer).
  void reset();
  // Step 3: waits for every bucket and hands the gradients over; a no-op when already done since reset().
  void finish_grad_sync() override;
  // Runs inside finish_grad_sync() as soon as bucket i's reduction is done, while later ones may
  // still be in flight: where a distributed optimizer steps that bucket's shard early.
  void set_on_bucket_reduced(std::function<void(int bucket)> fn) { on_bucket_reduced_ = std::move(fn); }

  BucketManager& bucket_manager() { return *buckets_; }
  const BucketManager& bucket_manager() const { return *buckets_; }
  ShardedBuckets& sharded_buckets();  // under ZeRO-1 and ZeRO-2; an error when the buckets are all-reduced
  // The experts' buffer (ExpertParams), over their expert-dp group, when ZeRO-1/2 shard it; else null.
  ShardedBuckets* expert_shards() const { return expert_shards_; }
  const BucketOptions& options() const { return options_; }
  ProcessGroup& dp_group() { return dp_group_; }
  const std::vector<Tensor>& params() const { return params_; }  // those that require grad

 private:
  void on_grad_accumulated(const Tensor& param);  // the AccumulateGrad hook
  void move_grad_to_main_grad(const Tensor& param);
  BucketManager& buckets_of(const Tensor& param) const { return kept_apart(param) ? *expert_buckets_ : *buckets_; }

  ProcessGroup& dp_group_;
  BucketOptions options_;
  std::function<void(int)> on_bucket_reduced_;
  std::vector<Tensor> params_;
  std::unique_ptr<BucketManager> buckets_;
  std::unique_ptr<BucketManager> expert_buckets_;  // ExpertParams' buffer, over their group; null without
  std::unordered_set<const TensorImpl*> expert_impls_;
  std::function<void(int)> scale_experts_;  // before each expert bucket's reduction: x 1 / ep (ExpertParams)
  ShardedBuckets* sharded_ = nullptr;  // buckets_, when it reduce-scatters
  ShardedBuckets* expert_shards_ = nullptr;  // expert_buckets_, when it reduce-scatters
  bool sums_tp_partial_grads_ = false;
  bool require_backward_grad_sync_ = true;
  bool callback_queued_ = false;  // this backward's finish_grad_sync is queued
  bool synced_ = false;           // grads were synced and reset() has not run since
  std::vector<autograd::RemovableHandle> hooks_;  // each also keeps its AccumulateGrad alive (picotron's grad_accs)
};

}  // namespace loom::parallel
