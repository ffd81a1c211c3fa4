#include "parallel/data_parallel/bucket.h"

#include <algorithm>

#include "parallel/teach/teach_break.h"
#include "tensor/ops.h"

namespace loom::parallel {

BucketManager::BucketManager(const std::vector<Tensor>& params, ProcessGroup& dp_group, double bucket_cap_mb,
                             bool allocate)
    : group_(dp_group), device_(params.empty() ? kCPU : params.front().device()) {
  // Bounded: the element count below is an int64 (1e30 MiB would overflow it).
  LOOM_CHECK(bucket_cap_mb > 0 && bucket_cap_mb <= 1e6, "BucketManager: bucket_cap_mb must be in (0, 1e6], got ",
             bucket_cap_mb);
  const int64_t cap = std::max<int64_t>(1, int64_t(bucket_cap_mb * 1024 * 1024 / sizeof(float)));
  const int64_t pad_to = int64_t(dp_group.size()) * kBucketPadElements;

  // 1. Assign params to buckets, walking them in reverse (the order backward
  //    produces their gradients); remember each param's offset in the buffer.
  int64_t end = 0;  // end of the last param placed
  auto close_bucket = [&] {
    Bucket& b = buckets_.back();
    b.numel = (end - b.offset + pad_to - 1) / pad_to * pad_to;
    b.reset_readiness();
    end = b.offset + b.numel;
  };
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    const Tensor& p = *it;
    LOOM_CHECK(is_floating(p.dtype()), "BucketManager: parameter ", p.describe(), " is not floating point");
    // The buffer lives beside the params (on their GPU with --device cuda), so
    // the hook's main_grad += grad stays on the device.
    LOOM_CHECK(p.device() == device_, "BucketManager: parameters on two devices (", device_.str(), " and ",
               p.describe(), " on ", p.device().str(), "); one gradient buffer serves one device");
    const int64_t used = buckets_.empty() ? 0 : end - buckets_.back().offset;  // elements in the open bucket
    if (buckets_.empty() || (used > 0 && used + p.numel() > cap)) {
      if (!buckets_.empty()) close_bucket();
      buckets_.emplace_back().offset = end;
    }
    Bucket& b = buckets_.back();
    const Slot s{int(buckets_.size()) - 1, int(b.params.size()), end, Tensor()};
    LOOM_CHECK(slots_.emplace(p.impl(), s).second, "BucketManager: parameter ", p.describe(), " is listed twice");
    b.params.push_back(p);
    end += p.numel();
  }
  if (!buckets_.empty()) close_bucket();
  if (!allocate) return;

  // 2. One zeroed fp32 buffer; each bucket's grad_data and each param's main_grad are views into it.
  buffer_ = zeros({numel()}, kFloat32, device_);
  for (Bucket& b : buckets_) {
    b.grad_data = ops::narrow(buffer_, 0, b.offset, b.numel);
    for (const Tensor& p : b.params)
      slots_.at(p.impl()).main_grad = ops::view(ops::narrow(buffer_, 0, offset_of(p), p.numel()), p.shape());
  }
}

const BucketManager::Slot& BucketManager::slot(const Tensor& p) const {
  auto it = slots_.find(p.impl());
  LOOM_CHECK(it != slots_.end(), "BucketManager: ", p.describe(),
             " is not one of the wrapped parameters that require grad");
  return it->second;
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
  const int index = int(&b - buckets_.data());
  for (const auto& fn : before_reduce_) fn(index);
  // The bug: dividing by dp here as well (as if the loss were already divided by the world size).
  if (teach::broken(teach::Break::DpDivideTwice) && b.grad_data.defined())
    ops::mul_(b.grad_data, 1.0 / double(group_.size()));
  b.work = launch_reduction(index);
}

std::shared_ptr<Work> BucketManager::launch_reduction(int b) {
  // picotron's Bucket.sync_gradient: the mean over dp ranks of the summed
  // gradients. The buffer is not touched again until wait() returns.
  return group_.all_reduce_async(buckets_[size_t(b)].grad_data, ReduceOp::Avg);
}

void BucketManager::wait() {
  for (Bucket& b : buckets_)
    if (!b.work) launch(b);
  for (size_t i = 0; i < buckets_.size(); ++i) wait_for(int(i));
}

void BucketManager::reset() {
  for (Bucket& b : buckets_) {
    LOOM_CHECK(!b.work || b.work->is_completed(), "BucketManager::reset: a bucket's all-reduce is still running "
               "(reset after wait())");
    b.reset_readiness();
  }
  ops::zero_(buffer_);
}

}  // namespace loom::parallel
