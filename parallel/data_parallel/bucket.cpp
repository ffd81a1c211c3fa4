#include "parallel/data_parallel/bucket.h"

#include <algorithm>

#include "parallel/teach/teach_break.h"
#include "tensor/ops.h"

namespace loom::parallel {

BucketManager::BucketManager(const std::vector<Tensor>& params, ProcessGroup& dp_group, double bucket_cap_mb,
                             GradReduce reduce, bool allocate_now)
    : group_(dp_group), reduce_(reduce), device_(params.empty() ? kCPU : params.front().device()) {
  // Bounded: the element count below is an int64 (1e30 MiB would overflow it).
  LOOM_CHECK(bucket_cap_mb > 0 && bucket_cap_mb <= 1e6, "BucketManager: bucket_cap_mb must be in (0, 1e6], got ",
             bucket_cap_mb);
  const int64_t cap = std::max<int64_t>(1, int64_t(bucket_cap_mb * 1024 * 1024 / sizeof(float)));
  const int64_t pad_to = int64_t(dp_group.size()) * kBucketPadElements;
  // The buffer lives beside the params (on their GPU with --device cuda), so
  // the hook's main_grad += grad stays on the device.
  const Device device = params.empty() ? kCPU : params.front().device();

  // 1. Assign params to buckets, walking them in reverse (the order backward
  //    produces their gradients); remember each param's offset in the buffer.
  struct Place { Tensor p; int bucket, index; int64_t offset; };
  std::vector<Place> places;
  int64_t end = 0;          // end of the last param placed
  int64_t bucket_used = 0;  // elements of params in the open bucket
  auto close_bucket = [&] {
    Bucket& b = buckets_.back();
    b.numel = (end - b.offset + pad_to - 1) / pad_to * pad_to;
    end = b.offset + b.numel;
  };
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    const Tensor& p = *it;
    LOOM_CHECK(is_floating(p.dtype()), "BucketManager: parameter ", p.describe(), " is not floating point");
    LOOM_CHECK(p.device() == device, "BucketManager: parameters on two devices (", device.str(), " and ",
               p.describe(), " on ", p.device().str(), "); one gradient buffer serves one device");
    if (buckets_.empty() || (bucket_used > 0 && bucket_used + p.numel() > cap)) {
      if (!buckets_.empty()) close_bucket();
      buckets_.push_back(Bucket{});
      buckets_.back().offset = end;
      bucket_used = 0;
    }
    Bucket& b = buckets_.back();
    places.push_back({p, int(buckets_.size()) - 1, int(b.params.size()), end});
    b.params.push_back(p);
    end += p.numel();
    bucket_used += p.numel();
  }
  if (!buckets_.empty()) close_bucket();

  for (Bucket& b : buckets_) {
    b.ready.assign(b.params.size(), false);
    b.all_reduce = reduce == GradReduce::AllReduce;
  }
  for (const Place& pl : places) {
    bool fresh = slots_.emplace(pl.p.impl(), Slot{pl.bucket, pl.index, pl.offset, Tensor()}).second;
    LOOM_CHECK(fresh, "BucketManager: parameter ", pl.p.describe(), " is listed twice");
  }
  if (allocate_now) allocate();
}

void BucketManager::allocate() {
  // 2. One zeroed fp32 buffer; buckets and main_grads are views into it. (A
  //    bucket ZeRO-2 keeps only this rank's [numel / dp] of fills a scratch
  //    during backward: grad_shards.h.)
  const int64_t dp = group_.size(), r = group_.rank();
  auto whole = [&](const Bucket& b) { return stores_whole(b); };
  auto stored = [&](const Bucket& b) { return whole(b) ? b.numel : b.numel / dp; };
  int64_t total = 0;
  for (const Bucket& b : buckets_) total += stored(b);
  buffer_ = zeros({total}, kFloat32, device_);
  int64_t at = 0;  // the bucket's first element in buffer_ (== b.offset when all are stored whole)
  for (Bucket& b : buckets_) {
    Tensor kept = ops::narrow(buffer_, 0, at, stored(b));
    at += stored(b);
    const int64_t n = b.numel / dp;
    b.grad_data = whole(b) ? kept : Tensor();
    b.shard_grad = whole(b) ? ops::narrow(kept, 0, r * n, n) : kept;
  }
  for (auto& [impl, s] : slots_) {
    const Bucket& b = buckets_[size_t(s.bucket)];
    const Tensor& p = b.params[size_t(s.index)];
    s.main_grad = b.grad_data.defined()
                      ? ops::view(ops::narrow(b.grad_data, 0, s.offset - b.offset, p.numel()), p.shape())
                      : Tensor();
  }
}

int64_t BucketManager::numel() const { return buckets_.empty() ? 0 : buckets_.back().offset + buckets_.back().numel; }

const std::vector<Tensor>& BucketManager::scratches() const {
  static const std::vector<Tensor> none;
  return none;
}

const BucketManager::Slot& BucketManager::slot(const Tensor& p) const {
  auto it = slots_.find(p.impl());
  LOOM_CHECK(it != slots_.end(), "BucketManager: ", p.describe(),
             " is not one of the wrapped parameters that require grad");
  return it->second;
}

int BucketManager::bucket_of(const Tensor& p) const { return slot(p).bucket; }

int64_t BucketManager::offset_of(const Tensor& p) const { return slot(p).offset; }

void BucketManager::all_reduce_bucket_of(const Tensor& p) {
  LOOM_CHECK(fixed_by_.empty(), "BucketManager::all_reduce_bucket_of(", p.describe(), "): the buckets' reductions "
             "were fixed by ", fixed_by_, "; mark shared weights before building it");
  Bucket& b = buckets_[size_t(bucket_of(p))];
  if (b.all_reduce) return;
  b.all_reduce = true;
  bucket_now_all_reduced();
}

BucketManager::Shard BucketManager::shard(int b) const {
  const Bucket& bucket = buckets_.at(size_t(b));
  const int64_t n = bucket.numel / group_.size();  // exact: buckets are padded to dp x 64
  return {bucket.offset + int64_t(group_.rank()) * n, n};
}

void BucketManager::mark_param_ready(const Tensor& p) {
  const Slot& s = slot(p);
  Bucket& b = buckets_[size_t(s.bucket)];
  LOOM_CHECK(!b.ready[size_t(s.index)], "BucketManager: gradient of ", p.describe(),
             " marked ready twice in one backward (call reset() between steps)");
  b.ready[size_t(s.index)] = true;
  if (++b.num_ready == int(b.params.size())) launch(b);
}

void BucketManager::launch(Bucket& b) {
  if (before_reduce_) before_reduce_(int(&b - buckets_.data()));
  // picotron's Bucket.sync_gradient: the mean over dp ranks of the summed
  // gradients. The buffer is not touched again until wait() returns.
  // The bug: dividing by dp here as well (as if the loss were already divided by the world size).
  if (teach::broken(teach::Break::DpDivideTwice) && b.grad_data.defined())
    ops::mul_(b.grad_data, 1.0 / double(group_.size()));
  if (b.all_reduce) b.work = group_.all_reduce_async(b.grad_data, ReduceOp::Avg);
  else launch_reduce_scatter(int(&b - buckets_.data()));
}

void BucketManager::launch_reduce_scatter(int b) {
  // Megatron's DDP with the distributed optimizer: the bucket [dp * n] is
  // reduced into this rank's [n] shard of itself, in place.
  Shard s = shard(b);
  buckets_[size_t(b)].work =
      group_.reduce_scatter_async(ops::narrow(buffer_, 0, s.offset, s.numel), buckets_[size_t(b)].grad_data, ReduceOp::Avg);
}

void BucketManager::wait(const std::function<void(int bucket)>& on_reduced) {
  for (Bucket& b : buckets_)
    if (!b.work) launch(b);
  for (size_t i = 0; i < buckets_.size(); ++i) {
    wait_for(int(i));
    if (on_reduced) on_reduced(int(i));
  }
}

void BucketManager::reset() {
  for (Bucket& b : buckets_) {
    LOOM_CHECK(!b.work || b.work->is_completed(), "BucketManager::reset: a bucket's all-reduce is still running "
               "(reset after wait())");
    b.work = nullptr;
    b.ready.assign(b.params.size(), false);
    b.num_ready = 0;
  }
  ops::zero_(buffer_);
}

}  // namespace loom::parallel
