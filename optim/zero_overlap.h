// ZeroOverlap: ZeRO-1's optimizer step started during backward, bucket by
// bucket (PyTorch's ZeroRedundancyOptimizer(overlap_with_ddp=True) driven by a
// DDP communication hook). DistributedOptimizer (distributed_optimizer.h) uses
// it when it applies; the lesson there reads the same without it.
//
// When it applies: nothing global may stand between a bucket's reduce-scatter
// and its update, so all three must hold -
//   no clipping       max_grad_norm == 0: the clip factor needs every bucket's norm
//   no loss scaling   found_inf must be known for the whole model before any
//                     param changes, or an overflowing step could not be skipped
//   every bucket      a bucket all-reduced for the tied embedding's handler
//   reduce-scattered  (ShardedBuckets::all_reduce_bucket_of) waits for that
//                     handler, which runs after backward
// Then ZeroDataParallelBucket's finish_grad_sync() (the after-backward callback;
// in a pipeline, after the schedule), which waits for the buckets in order, steps bucket b's owned ranges and launches its param
// all-gather the moment b's reduce-scatter is done, while later buckets are
// still being reduced:
//   comm      | reduce-scatter b0 | reduce-scatter b1 | gather b0 | gather b1 |
//   compute   | backward ...      | step b0           | step b1   |
// DistributedOptimizer::step() then has nothing left to update; it reports the
// gradient norm.
#pragma once

namespace loom::parallel {
class ShardedBuckets;
class ZeroDataParallelBucket;
}  // namespace loom::parallel

namespace loom::optim {

class DistributedOptimizer;
struct MixedPrecisionOptions;

class ZeroOverlap {
 public:
  // The three conditions above.
  static bool applies(const MixedPrecisionOptions& options, const parallel::ShardedBuckets& buckets);

  // Steps opt's buckets from dp's finish_grad_sync() until destroyed.
  ZeroOverlap(DistributedOptimizer& opt, parallel::ZeroDataParallelBucket& dp);
  ~ZeroOverlap();
  ZeroOverlap(const ZeroOverlap&) = delete;
  ZeroOverlap& operator=(const ZeroOverlap&) = delete;

  // For step(): true if every bucket was stepped since the last call, false if
  // none was (no synced backward: step() steps them itself); an error if only
  // some were.
  bool take_all_stepped();

 private:
  DistributedOptimizer& opt_;
  parallel::ZeroDataParallelBucket& dp_;
  int stepped_ = 0;  // buckets stepped since the last take_all_stepped()
};

}  // namespace loom::optim
