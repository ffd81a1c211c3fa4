#include "parallel/data_parallel/zero_data_parallel_bucket.h"

#include "autograd/engine.h"
#include "parallel/data_parallel/tp_partial_grads.h"

namespace loom::parallel {

ZeroDataParallelBucket::ZeroDataParallelBucket(const NamedParams& params, ProcessGroup& dp_group, GradReduce reduce,
                                               double bucket_cap_mb, ExpertParams experts)
    : DataParallelBucket(params, dp_group, {bucket_cap_mb, /*grads_to_params=*/false}, std::move(experts),
                         [reduce, bucket_cap_mb](const std::vector<Tensor>& group_params, ProcessGroup& group) {
                           return make_sharded_buckets(reduce, group_params, group, bucket_cap_mb);
                         }),
      reduce_(reduce) {}

void ZeroDataParallelBucket::sum_tp_partial_grads_before_reduce(const std::vector<Tensor>& partial,
                                                               ProcessGroup& tp_group) {
  for (BucketManager* buffer : buffers_.all())
    parallel::sum_tp_partial_grads_before_reduce(sharded(*buffer), partial, tp_group);
  sums_tp_partial_grads_ = true;
}

bool ZeroDataParallelBucket::holds_whole_grad(const Tensor& param) const {
  const ShardedBuckets& buckets = shards_of(param);
  return buckets.all_reduced(buckets.bucket_of(param));
}

void ZeroDataParallelBucket::on_grad_accumulated(const Tensor& param) {
  ShardedBuckets& buckets = shards_of(param);
  buckets.open_bucket_of(param);  // ZeRO-2: the bucket's first gradient takes a scratch for its main_grads
  // 1-3: add .grad into main_grad, drop it; unless no_sync, reduce-scatter the bucket once it is full.
  DataParallelBucket::on_grad_accumulated(param);
  if (require_backward_grad_sync_ || !buckets.reduces_every_micro_batch(param)) return;
  // ZeRO-2 in a no_sync backward: reduce-scatter all the same (only a reduced micro-batch can be
  // summed into a shard), and end the backward waiting for it, its scratch free for the next one.
  if (!callback_queued_) {
    autograd::Engine::queue_callback([this] {
      callback_queued_ = false;
      for (BucketManager* buffer : buffers_.all()) sharded(*buffer).finish_micro_batch();
    });
    callback_queued_ = true;
  }
  buckets.mark_param_ready(param);
}

}  // namespace loom::parallel
