#include "parallel/data_parallel/grad_shards.h"

#include <algorithm>

#include "parallel/trace/trace.h"
#include "tensor/ops.h"

namespace loom::parallel {

GradShards::GradShards(std::vector<Bucket>& buckets, ProcessGroup& dp_group) : buckets_(buckets), group_(dp_group) {
  int64_t largest = 0, scattered = 0;
  for (const Bucket& b : buckets_)
    if (!b.all_reduce) largest = std::max(largest, b.numel), ++scattered;
  const Device device = buckets_.empty() ? kCPU : buckets_.front().shard_grad.device();
  for (int64_t i = 0; i < std::min<int64_t>(2, scattered); ++i) scratch_.push_back(zeros({largest}, kFloat32, device));
  owner_.assign(scratch_.size(), -1);
}

void GradShards::open(int b) {
  Bucket& bucket = buckets_[size_t(b)];
  if (bucket.scratch >= 0) return;
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
  bucket.scratch = int(free - owner_.begin());
  bucket.grad_data = ops::narrow(scratch_[size_t(bucket.scratch)], 0, 0, bucket.numel);
  ops::zero_(bucket.grad_data);
}

void GradShards::launch(int b) {
  Bucket& bucket = buckets_[size_t(b)];
  open(b);  // a bucket none of whose params got a gradient: zeros, as on every other rank
  const int64_t n = bucket.numel / group_.size();
  bucket.work = group_.reduce_scatter_async(ops::narrow(bucket.grad_data, 0, group_.rank() * n, n), bucket.grad_data,
                                            ReduceOp::Avg);
  in_flight_.push_back(b);
}

void GradShards::finish(int b) {
  Bucket& bucket = buckets_[size_t(b)];
  if (bucket.scratch < 0) return;
  LOOM_CHECK(bucket.work, "GradShards::finish: bucket ", b, " was never launched");
  {
    trace::Span span(str("wait for reduce-scatter ", b));
    bucket.work->wait();
  }
  const int64_t n = bucket.numel / group_.size();
  ops::add_(bucket.shard_grad, ops::narrow(bucket.grad_data, 0, group_.rank() * n, n));  // micro-batches sum here
  owner_[size_t(bucket.scratch)] = -1;
  bucket.scratch = -1;
  bucket.grad_data = Tensor();
  in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), b));
}

void GradShards::finish_all() {
  while (!in_flight_.empty()) finish(in_flight_.front());
}

}  // namespace loom::parallel
