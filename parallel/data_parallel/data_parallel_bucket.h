// DataParallelBucket: data parallelism whose gradient all-reduces overlap
// backward (picotron's DataParallelBucket; Megatron's DistributedDataParallel
// with overlap_grad_reduce; PyTorch DDP's reducer).
//
// How a backward pass goes (see bucket.h for the buffer):
//   1. A hook on each parameter's AccumulateGrad node runs when the
//      parameter's gradient is ready: it adds .grad into the param's fp32
//      main_grad (a view into the bucket buffer), drops .grad (the buffer holds
//      it now) and marks the param ready. The first hook of the pass also queues
//      a callback on the autograd engine.
//   2. When every param of a bucket is ready, the bucket's all-reduce (average
//      over dp) is launched asynchronously; backward goes on with earlier layers
//      while the dp group's communication thread runs it.
//   3. The callback runs after backward (or, under defer_grad_sync(), the
//      caller runs finish_grad_sync() later: a pipeline schedule, after its
//      last send_backward): it waits for every bucket, then
//      writes the averaged gradient back as .grad for the optimizer - for an
//      fp32 param .grad *is* its main_grad view (no copy; picotron does
//      `param.grad = param.main_grad`), for a bf16/fp16 param .grad is a copy
//      rounded to the param's dtype (a mixed-precision optimizer reads the fp32
//      main_grad(param) instead, and turns grads_to_params off). In
//      ReduceScatter mode (ZeRO-1) each rank gets only its shard's average and
//      no .grad is written.
//
// Expert parallelism (ExpertParams, data_parallel_common.h): the experts' params
// get a second buffer of their own, reduced over the expert-dp group (all-reduced,
// or under ZeRO-1/2 reduce-scattered) and scaled by 1 / ep before (Megatron's
// expert_parallel_buffers); the same hook fills either, and the sync waits for both.
//
//   DataParallelBucket dp(model.named_parameters(), pgm.dp_group(), {.bucket_cap_mb = 25});
//   for (step...) {
//     for (micro-batches but the last) { auto guard = dp.no_sync(); backward(loss / K); }
//     backward(loss / K);   // syncs the sum of all micro-batches
//                           // (ZeRO-2, ShardGrads: every micro-batch reduce-scatters; grad_shards.h)
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
  // ReduceScatter: ZeRO-1, each dp rank keeps the average of its own shard of
  // every bucket (optim/distributed_optimizer.h); no .grad is handed back.
  // ShardGrads: ZeRO-2, the same shards and no whole buffer (grad_shards.h).
  GradReduce reduce = GradReduce::AllReduce;
  // After the sync, hand the averaged gradient to the params as .grad. Off when
  // the optimizer reads main_grad itself (optim/mixed_precision_optimizer.h), so
  // that bf16/fp16 params get no rounded .grad copies.
  bool grads_to_params = true;
};

class DataParallelBucket : public DataParallel {
 public:
  // Broadcasts the params from dp rank 0 (collective over dp_group), lays out
  // the buffer, hooks every param that requires grad (the others are skipped).
  // Destroying it unregisters the hooks (they are owned by hooks_).
  // experts: params kept apart, over their own group, reduced as options.reduce says (under ZeRO-1/2
  // reduce-scattered over it: a DistributedOptimizer shards them over expert-dp).
  DataParallelBucket(const NamedParams& params, ProcessGroup& dp_group, BucketOptions options = {},
                     ExpertParams experts = {});
  DataParallelBucket(const DataParallelBucket&) = delete;
  DataParallelBucket& operator=(const DataParallelBucket&) = delete;

  // The fp32 gradient of param: a view into the bucket buffer.
  Tensor main_grad(const Tensor& param) const { return buckets_of(param).main_grad(param); }

  // Gradient accumulation: inside the guard backward only adds into main_grad.
  [[nodiscard]] NoSyncGuard no_sync() override { return NoSyncGuard(require_backward_grad_sync_); }
  void zero_grad() override { reset(); }
  // The end of the first synced backward waits for every bucket.
  bool syncs_once_per_step() const override { return true; }
  Tensor grad_of(const Tensor& param) const override { return main_grad(param); }
  // A bf16/fp16 param's .grad is a rounded copy of main_grad: rounds it again.
  void grad_changed(const Tensor& param) override;
  // False for a param in a reduce-scattered bucket (ZeRO-1).
  bool holds_whole_grad(const Tensor& param) const override;
  bool sums_tp_partial_grads() const override { return tp_group_ != nullptr; }
  // Sequence parallelism's params whose gradient is each tp rank's partial
  // sum over its T / tp tokens (layernorms, row-parallel biases): from now on
  // summed over tp_group as their bucket's reduction is launched. Under ZeRO
  // only a shard is left after it, so finalize_model_grads could no longer sum
  // them (FullyShardedOptions::tp_partial_grads does the same under ZeRO-3).
  void sum_tp_partial_grads_before_reduce(std::vector<Tensor> partial, ProcessGroup& tp_group);
  bool require_backward_grad_sync() const { return require_backward_grad_sync_; }
  // Whether param is one of the ExpertParams, in their own all-reduced buffer (not in bucket_manager()'s).
  bool kept_apart(const Tensor& param) const { return expert_buckets_ && expert_impls_.count(param.impl()); }

  // Zeroes every main_grad and drops every .grad. Call once per optimizer step,
  // before the next step's first backward (Megatron's zero_grad_buffer).
  void reset();

  // Waits for every bucket's reduction and hands the gradients over (step 3
  // above). Runs as the after-backward callback, or where the caller puts it
  // under defer_grad_sync(). A no-op when already done since reset().
  void finish_grad_sync() override;

  // Runs inside finish_grad_sync() as soon as bucket i's reduction is
  // done, while later buckets may still be in flight: where a distributed
  // optimizer can step that bucket's shard early (PyTorch's ZeRO + DDP hook).
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
  void sum_tp_partial_grads(int bucket);  // BucketOptions::tp_partial_grads, before the bucket's reduction
  // The buffer holding param: the experts' (ExpertParams) or everything else's.
  BucketManager& buckets_of(const Tensor& param) const {
    return kept_apart(param) ? *expert_buckets_ : *buckets_;
  }

  ProcessGroup& dp_group_;
  BucketOptions options_;
  std::function<void(int)> on_bucket_reduced_;
  std::vector<Tensor> tp_partial_grads_;  // sum_tp_partial_grads_before_reduce
  ProcessGroup* tp_group_ = nullptr;
  std::vector<Tensor> params_;
  std::unique_ptr<BucketManager> buckets_;
  std::unique_ptr<BucketManager> expert_buckets_;  // ExpertParams' buffer, over their group; null without
  std::unordered_set<const TensorImpl*> expert_impls_;
  ShardedBuckets* sharded_ = nullptr;  // buckets_, when it reduce-scatters
  ShardedBuckets* expert_shards_ = nullptr;  // expert_buckets_, when it reduce-scatters
  bool require_backward_grad_sync_ = true;
  bool callback_queued_ = false;  // this backward's finish_grad_sync is queued
  bool synced_ = false;           // grads were synced and reset() has not run since
  // The hooks, registered while this wrapper lives; each handle also keeps its
  // param's AccumulateGrad node alive (picotron's grad_accs).
  std::vector<autograd::RemovableHandle> hooks_;
};

}  // namespace loom::parallel
