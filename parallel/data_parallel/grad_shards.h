// ShardedBuckets and GradShards: the buckets of bucket.h, reduce-scattered so
// that each dp rank keeps only its shard (Rajbhandari et al. 2020, ZeRO).
//
// ShardedBuckets (ZeRO-1; Megatron's DDP with the distributed optimizer):
// dp rank r ends with the average of shard r only, elements [r n/dp, (r+1) n/dp)
// of each bucket - all that the distributed optimizer needs, for half the
// traffic of an all-reduce. The rest of the bucket keeps this rank's local
// sums: it is not a gradient any more. Single buckets can still be
// all-reduced (all_reduce_bucket_of): a weight shared across pipeline stages
// needs its whole gradient on both stages, whose shards of it differ.
//
// GradShards (ZeRO-2, stage 2 "P_os+g"; DeepSpeed's partitioned gradients with
// a reduce bucket): ZeRO-1 keeps the whole fp32 gradient buffer and reads only
// its 1/dp after the step; ZeRO-2 keeps only that 1/dp: a bucket's gradient
// exists whole only while backward fills it and its reduce-scatter runs.
//
// Per rank, fp32, N params in buckets of at most B elements (padded):
//   ZeRO-1   buffer [N]                           4 N bytes
//   ZeRO-2   shards [N / dp] + 2 scratches [B]    4 N / dp + 8 B bytes
// Two scratches, so that backward fills bucket b+1 while bucket b's
// reduce-scatter is in flight (double buffering); one bucket (a small model at
// the default --bucket-mb) needs one. A bucket takes a free scratch at its
// first gradient; when none is free it waits for the oldest reduce-scatter in
// flight, which gives its scratch back (a third scratch is allocated only if
// three buckets fill at once, which reverse-order buckets do not).
//
// One bucket's life under ZeRO-2, per micro-batch:
//   open      first gradient: a scratch, zeroed; main_grad views point into it
//   fill      the hooks add each .grad into main_grad, as under ZeRO-1
//   launch    last gradient: reduce-scatter (average over dp) the scratch in
//             place, async; rank r's average lands in the scratch's r-th 1/dp
//   finish    (the next bucket needs the scratch, or backward ends): wait,
//             shard_grad += that 1/dp, the scratch is free again
//
// Gradient accumulation, the trade: a shard cannot sum micro-batches before
// they are reduced (no rank holds the whole bucket), so every micro-batch
// reduce-scatters and the shard sums the averages: K micro-batches cost K
// reduce-scatters (ZeRO-1 and DDP: one, inside no_sync) but no memory beyond
// the shards. DeepSpeed's stage 2 makes the same choice. The other, keeping a
// whole buffer across micro-batches, is ZeRO-1's memory.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "parallel/data_parallel/bucket.h"

namespace loom::parallel {

// How ZeroDataParallelBucket (zero_data_parallel_bucket.h) reduce-scatters its buckets: with the
// whole buffer kept (ZeRO-1, ShardedBuckets) or with only the shards (ZeRO-2, GradShards).
enum class GradReduce { ReduceScatter, ShardGrads };

class ShardedBuckets : public BucketManager {
 public:
  // Every bucket starts reduce-scattered. allocate false: the subclass allocates (GradShards).
  ShardedBuckets(const std::vector<Tensor>& params, ProcessGroup& dp_group, double bucket_cap_mb,
                 bool allocate = true);

  // This rank's shard of bucket b: [offset, offset + numel) in the buffer, a
  // contiguous 1/dp of the bucket (the part a distributed optimizer owns).
  struct Shard {
    int64_t offset, numel;
  };
  Shard shard(int b) const;
  // This rank's shard of bucket b's average: [shard(b).numel] fp32, a view into
  // the buffer (ZeRO-2: all of b the buffer keeps), what the optimizer steps.
  const Tensor& shard_grad(int b) const { return shard_grads_.at(size_t(b)); }
  // Reduce p's whole bucket with an all-reduce instead (before the first
  // backward, and before fix_reductions()).
  void all_reduce_bucket_of(const Tensor& p);
  bool all_reduced(int b) const { return all_reduced_.at(size_t(b)); }  // by all_reduce_bucket_of
  // From now on all_reduce_bucket_of() is an error naming `by`: a distributed
  // optimizer has planned its steps around how each bucket is reduced.
  void fix_reductions(std::string by) { fixed_by_ = std::move(by); }
  // fn(b) runs in wait() once bucket b's reduction is done, while later ones may still be in
  // flight: the distributed optimizer steps that bucket's shard early (optim/zero_overlap.h).
  void set_after_reduce(std::function<void(int bucket)> fn) { after_reduce_ = std::move(fn); }

  // What ZeRO-2 (GradShards) changes in DataParallelBucket's hook (zero_data_parallel_bucket.h):
  // p's bucket takes a scratch at its first gradient, and is reduce-scattered in a no_sync
  // backward too, which finish_micro_batch() ends. ZeRO-1: nothing.
  virtual void open_bucket_of(const Tensor&) {}
  virtual bool reduces_every_micro_batch(const Tensor&) const { return false; }
  virtual void finish_micro_batch() {}
  virtual std::vector<Tensor> scratches() const { return {}; }  // ZeRO-2's, bucket-sized

 protected:
  // Megatron's DDP with the distributed optimizer: the bucket [dp * n] is
  // reduced into this rank's [n] shard of itself, in place.
  std::shared_ptr<Work> launch_reduction(int b) override;
  void wait_for(int b) override {
    reduced(b);
    if (after_reduce_) after_reduce_(b);
  }
  virtual void reduced(int b) { BucketManager::wait_for(b); }  // waits for bucket b's reduction
  virtual void bucket_now_all_reduced() {}

  std::vector<Tensor> shard_grads_;  // [bucket] shard_grad(b)
  std::vector<bool> all_reduced_;    // [bucket] all-reduced instead (all_reduce_bucket_of)

 private:
  std::string fixed_by_;  // who fixed the buckets' reductions (fix_reductions), or empty
  std::function<void(int)> after_reduce_;
};

class GradShards : public ShardedBuckets {
 public:
  // The layout of BucketManager; allocates the shards and the scratches
  // (bucket-sized: the largest reduce-scattered bucket).
  GradShards(const std::vector<Tensor>& params, ProcessGroup& dp_group, double bucket_cap_mb);

  // A view into the scratch p's bucket is filling, only between its first
  // gradient and the end of its reduce-scatter (an error otherwise: this rank
  // keeps only its shard, shard_grad).
  Tensor main_grad(const Tensor& p) const override;
  // The first gradient of a reduce-scattered bucket takes a scratch for it (open).
  void open_bucket_of(const Tensor& p) override;
  // After a no_sync backward: launch the reduce-scattered buckets not launched
  // yet, wait for them, and forget their readiness for the next micro-batch.
  void finish_micro_batch() override;
  bool reduces_every_micro_batch(const Tensor& p) const override { return !all_reduced_[size_t(bucket_of(p))]; }
  std::vector<Tensor> scratches() const override { return scratch_; }

 private:
  // All of b's gradients are in: reduce-scatter its scratch in place, async.
  std::shared_ptr<Work> launch_reduction(int b) override;
  void reduced(int b) override;  // + adds this rank's part into the shard
  void bucket_now_all_reduced() override;  // stored whole now (all still zero: before any backward)
  // The buffer: of a reduce-scattered bucket only this rank's [numel / dp], an all-reduced one whole.
  void allocate();
  void allocate_scratches();
  // Bucket b's first gradient of this backward: b.grad_data becomes a zeroed
  // scratch (waiting for the oldest reduce-scatter in flight if none is free).
  void open(int b);
  // Waits for b's reduce-scatter, adds this rank's part into shard_grad(b) and
  // frees the scratch (a no-op when b holds none).
  void finish(int b);

  std::vector<Tensor> scratch_;  // [2] fp32 [largest bucket], one per bucket in flight
  std::vector<int> owner_;       // [scratch] the bucket in it, -1: free
  std::vector<int> scratch_of_;  // [bucket] the scratch its grad_data lives in, -1: none
  std::deque<int> in_flight_;    // launched buckets still holding a scratch, oldest first
};

// The buckets of params over group, reduce-scattered as `reduce` says:
// ShardedBuckets (ZeRO-1) or GradShards (ZeRO-2).
std::unique_ptr<ShardedBuckets> make_sharded_buckets(GradReduce reduce, const std::vector<Tensor>& params,
                                                     ProcessGroup& group, double bucket_cap_mb);

}  // namespace loom::parallel
