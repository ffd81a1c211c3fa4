// ZeroDataParallelBucket: DataParallelBucket for a distributed optimizer (ZeRO-1
// and ZeRO-2; Megatron's DistributedDataParallel with use_distributed_optimizer,
// whose buffers its DistributedOptimizer reads). The backward is DataParallelBucket's
// (data_parallel_bucket.h); what changes is what the buckets keep:
//   reduce-scatter  each bucket is reduce-scattered, not all-reduced: dp rank r
//                   keeps the average of shard r only (ShardedBuckets::shard_grad,
//                   grad_shards.h), which optim/distributed_optimizer.h steps; no
//                   .grad is handed over
//   ZeRO-2          only those shards are stored (GradShards): a bucket fills a
//                   scratch, opened at its first gradient, and is reduce-scattered
//                   in a no_sync backward too (its shard sums the micro-batches'
//                   averages: no rank holds the bucket whole to sum them before)
//   whole buckets   a bucket may stay all-reduced (all_reduce_bucket_of): the
//                   pipeline's tied embedding, whose gradient is summed over its
//                   stages after the sync (finalize_model_grads.h)
//   tp sums         sequence parallelism's partial gradients are summed over tp
//                   as their bucket's reduction is launched, while it is whole
//                   (tp_partial_grads.h); finalize_model_grads could not, later
//
//   ZeroDataParallelBucket dp(model.named_parameters(), pgm.dp_group(), GradReduce::ShardGrads);
//   optim::DistributedOptimizer opt(groups, dp);   // steps dp's shards
#pragma once

#include <vector>

#include "parallel/data_parallel/data_parallel_bucket.h"
#include "parallel/data_parallel/grad_shards.h"

namespace loom::parallel {

class ZeroDataParallelBucket : public DataParallelBucket {
 public:
  // reduce: ReduceScatter (ZeRO-1) or ShardGrads (ZeRO-2). Collective over dp_group, as
  // DataParallelBucket's; the experts' buffer (expert_buckets.h) is reduce-scattered alike.
  ZeroDataParallelBucket(const NamedParams& params, ProcessGroup& dp_group, GradReduce reduce,
                         double bucket_cap_mb = BucketOptions{}.bucket_cap_mb, ExpertParams experts = {});

  GradReduce reduce() const { return reduce_; }
  ProcessGroup& dp_group() const { return sharded_buckets().group(); }
  // bucket_manager(), as what it is: the dense params' buckets, reduce-scattered over dp.
  ShardedBuckets& sharded_buckets() const { return sharded(*buffers_.dense); }
  // The experts' buffer (over expert-dp), or null without experts kept apart.
  ShardedBuckets* expert_shards() const { return buffers_.experts ? &sharded(*buffers_.experts) : nullptr; }

  // Sequence parallelism: these params' gradients are summed over tp_group as their bucket's
  // reduction is launched (tp_partial_grads.h). The experts are whole on every tp rank, so theirs
  // are partial sums too: summed after their 1 / ep scale (expert_buckets.h).
  void sum_tp_partial_grads_before_reduce(const std::vector<Tensor>& partial, ProcessGroup& tp_group);

  // What finalize_model_grads asks (data_parallel_common.h).
  bool holds_whole_grad(const Tensor& param) const override;  // false in a reduce-scattered bucket
  bool sums_tp_partial_grads() const override { return sums_tp_partial_grads_; }

 private:
  // DataParallelBucket's hook, plus ZeRO-2's scratch and its no_sync reduce-scatters.
  void on_grad_accumulated(const Tensor& param) override;
  ShardedBuckets& shards_of(const Tensor& param) const { return sharded(buffers_.of(param)); }
  // Every buffer was built by make_sharded_buckets (the constructor's make): a ShardedBuckets.
  static ShardedBuckets& sharded(BucketManager& buffer) { return static_cast<ShardedBuckets&>(buffer); }

  GradReduce reduce_;
  bool sums_tp_partial_grads_ = false;
};

}  // namespace loom::parallel
