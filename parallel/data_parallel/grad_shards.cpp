#include "parallel/data_parallel/grad_shards.h"

#include <algorithm>

#include "parallel/trace/trace.h"
#include "tensor/ops.h"

namespace loom::parallel {

// ---- ZeRO-1: the buckets reduce-scattered -------------------------------------------

ShardedBuckets::ShardedBuckets(const std::vector<Tensor>& params, ProcessGroup& dp_group, double bucket_cap_mb,
                               bool allocate)
    : BucketManager(params, dp_group, bucket_cap_mb, allocate),
      shard_grads_(buckets_.size()),
      all_reduced_(buckets_.size(), false) {
  if (allocate)
    for (size_t i = 0; i < buckets_.size(); ++i)
      shard_grads_[i] = ops::narrow(buffer_, 0, shard(int(i)).offset, shard(int(i)).numel);
}

ShardedBuckets::Shard ShardedBuckets::shard(int b) const {
  const Bucket& bucket = buckets_.at(size_t(b));
  const int64_t n = bucket.numel / group_.size();  // exact: buckets are padded to dp x 64
  return {bucket.offset + int64_t(group_.rank()) * n, n};
}

void ShardedBuckets::all_reduce_bucket_of(const Tensor& p) {
  LOOM_CHECK(fixed_by_.empty(), "BucketManager::all_reduce_bucket_of(", p.describe(), "): the buckets' reductions "
             "were fixed by ", fixed_by_, "; mark shared weights before building it");
  const size_t b = size_t(bucket_of(p));
  if (all_reduced_[b]) return;
  all_reduced_[b] = true;
  bucket_now_all_reduced();
}

std::shared_ptr<Work> ShardedBuckets::launch_reduction(int b) {
  if (all_reduced_[size_t(b)]) return BucketManager::launch_reduction(b);
  Shard s = shard(b);
  return group_.reduce_scatter_async(ops::narrow(buffer(), 0, s.offset, s.numel), buckets_[size_t(b)].grad_data,
                                     ReduceOp::Avg);
}

// ---- ZeRO-2: only the shards kept -----------------------------------------------------

GradShards::GradShards(const std::vector<Tensor>& params, ProcessGroup& dp_group, double bucket_cap_mb)
    : ShardedBuckets(params, dp_group, bucket_cap_mb, /*allocate=*/false) {
  allocate();
  allocate_scratches();
}

void GradShards::allocate() {
  const int64_t dp = group_.size(), r = group_.rank();
  auto stored = [&](size_t i) { return all_reduced_[i] ? buckets_[i].numel : buckets_[i].numel / dp; };
  int64_t total = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) total += stored(i);
  buffer_ = zeros({total}, kFloat32, device_);
  int64_t at = 0;  // the bucket's first element in buffer_
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    const bool whole = all_reduced_[i];
    Tensor kept = ops::narrow(buffer_, 0, at, stored(i));
    at += stored(i);
    const int64_t n = b.numel / dp;
    b.grad_data = whole ? kept : Tensor();  // a scattered bucket's fills a scratch during backward
    shard_grads_[i] = whole ? ops::narrow(kept, 0, r * n, n) : kept;
    for (const Tensor& p : b.params)
      slots_.at(p.impl()).main_grad =
          whole ? ops::view(ops::narrow(kept, 0, offset_of(p) - b.offset, p.numel()), p.shape()) : Tensor();
  }
}

void GradShards::allocate_scratches() {
  int64_t largest = 0, scattered = 0;
  for (size_t i = 0; i < buckets_.size(); ++i)
    if (!all_reduced_[i]) largest = std::max(largest, buckets_[i].numel), ++scattered;
  scratch_.clear();
  for (int64_t i = 0; i < std::min<int64_t>(2, scattered); ++i) scratch_.push_back(zeros({largest}, kFloat32, device_));
  owner_.assign(scratch_.size(), -1);
  scratch_of_.assign(buckets_.size(), -1);
}

void GradShards::bucket_now_all_reduced() {
  allocate();
  allocate_scratches();
}

Tensor GradShards::main_grad(const Tensor& p) const {
  const Slot& s = slot(p);
  if (s.main_grad.defined()) return s.main_grad;
  const Bucket& b = buckets_[size_t(s.bucket)];
  LOOM_CHECK(b.grad_data.defined(), "BucketManager: ZeRO-2 keeps no whole gradient of ", p.describe(),
             " once its bucket is reduce-scattered; this rank holds only its shard (shard_grad)");
  return ops::view(ops::narrow(b.grad_data, 0, s.offset - b.offset, p.numel()), p.shape());
}

void GradShards::open_bucket_of(const Tensor& p) {
  const Slot& s = slot(p);
  if (!s.main_grad.defined()) open(s.bucket);  // the bucket's first gradient of this backward: take a scratch
}

void GradShards::open(int b) {
  Bucket& bucket = buckets_[size_t(b)];
  if (scratch_of_[size_t(b)] >= 0) return;
  auto free = std::find(owner_.begin(), owner_.end(), -1);
  if (free == owner_.end() && !in_flight_.empty()) {  // bucket b-1 is still being reduced: wait for it
    finish(in_flight_.front());
    free = std::find(owner_.begin(), owner_.end(), -1);
  }
  if (free == owner_.end()) {  // three buckets filling at once: not with reverse-order buckets
    scratch_.push_back(zeros(scratch_.front().shape(), kFloat32, scratch_.front().device()));
    owner_.push_back(-1);
    free = owner_.end() - 1;
  }
  *free = b;
  scratch_of_[size_t(b)] = int(free - owner_.begin());
  bucket.grad_data = ops::narrow(scratch_[size_t(scratch_of_[size_t(b)])], 0, 0, bucket.numel);
  ops::zero_(bucket.grad_data);
}

std::shared_ptr<Work> GradShards::launch_reduction(int b) {
  Bucket& bucket = buckets_[size_t(b)];
  if (all_reduced_[size_t(b)]) return BucketManager::launch_reduction(b);
  open(b);  // a bucket none of whose params got a gradient: zeros, as on every other rank
  const int64_t n = bucket.numel / group_.size();
  in_flight_.push_back(b);
  return group_.reduce_scatter_async(ops::narrow(bucket.grad_data, 0, group_.rank() * n, n), bucket.grad_data,
                                     ReduceOp::Avg);
}

void GradShards::reduced(int b) {
  if (all_reduced_[size_t(b)]) return BucketManager::wait_for(b);
  finish(b);
}

void GradShards::finish(int b) {
  Bucket& bucket = buckets_[size_t(b)];
  if (scratch_of_[size_t(b)] < 0) return;
  LOOM_CHECK(bucket.work, "GradShards::finish: bucket ", b, " was never launched");
  {
    trace::Span span(str("wait for reduce-scatter ", b));
    bucket.work->wait();
  }
  const int64_t n = bucket.numel / group_.size();
  ops::add_(shard_grads_[size_t(b)], ops::narrow(bucket.grad_data, 0, group_.rank() * n, n));  // micro-batches sum here
  owner_[size_t(scratch_of_[size_t(b)])] = -1;
  scratch_of_[size_t(b)] = -1;
  bucket.grad_data = Tensor();
  in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), b));
}

void GradShards::finish_micro_batch() {
  for (size_t i = 0; i < buckets_.size(); ++i)
    if (!all_reduced_[i] && !buckets_[i].work) launch(buckets_[i]);
  while (!in_flight_.empty()) finish(in_flight_.front());
  for (size_t i = 0; i < buckets_.size(); ++i)
    if (!all_reduced_[i]) buckets_[i].reset_readiness();
}

std::unique_ptr<ShardedBuckets> make_sharded_buckets(GradReduce reduce, const std::vector<Tensor>& params,
                                                     ProcessGroup& group, double bucket_cap_mb) {
  if (reduce == GradReduce::ShardGrads) return std::make_unique<GradShards>(params, group, bucket_cap_mb);
  return std::make_unique<ShardedBuckets>(params, group, bucket_cap_mb);
}

}  // namespace loom::parallel
