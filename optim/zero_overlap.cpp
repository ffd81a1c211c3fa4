#include "optim/zero_overlap.h"

#include "optim/distributed_optimizer.h"

namespace loom::optim {

bool ZeroOverlap::applies(const MixedPrecisionOptions& options, const parallel::ShardedBuckets& buckets) {
  bool all_scattered = true;
  for (size_t b = 0; b < buckets.buckets().size(); ++b) all_scattered &= !buckets.all_reduced(int(b));
  return options.max_grad_norm == 0 && !options.loss_scaling && all_scattered;
}

ZeroOverlap::ZeroOverlap(DistributedOptimizer& opt, parallel::ZeroDataParallelBucket& dp) : opt_(opt), dp_(dp) {
  dp_.sharded_buckets().set_after_reduce([this](int b) {
    opt_.step_bucket(opt_.dense_, b);
    ++stepped_;
  });
}

ZeroOverlap::~ZeroOverlap() { dp_.sharded_buckets().set_after_reduce(nullptr); }

bool ZeroOverlap::take_all_stepped() {
  const int stepped = stepped_, buckets = int(opt_.dense_.bucket_mains.size());
  stepped_ = 0;
  LOOM_CHECK(stepped == 0 || stepped == buckets, "DistributedOptimizer::step: only ", stepped, " of ", buckets,
             " buckets were stepped during backward");
  return stepped == buckets;
}

}  // namespace loom::optim
