#include "parallel/data_parallel/tp_partial_grads.h"

#include "parallel/data_parallel/data_parallel_common.h"

namespace loom::parallel {

void sum_tp_partial_grads_before_reduce(BucketManager& buckets, std::vector<Tensor> partial, ProcessGroup& tp_group) {
  buckets.add_before_reduce([&buckets, partial = std::move(partial), &tp_group](int b) {
    const Bucket& bucket = buckets.buckets()[size_t(b)];
    if (!bucket.grad_data.defined()) return;  // ZeRO-2: no gradient reached it (on every tp rank alike)
    std::vector<Tensor> grads;  // main_grad views of the bucket's partial params; a few C-sized vectors
    for (const Tensor& p : bucket.params)
      for (const Tensor& q : partial)
        if (p.impl() == q.impl()) grads.push_back(buckets.main_grad(p));
    all_reduce_coalesced(grads, tp_group);
  });
}

}  // namespace loom::parallel
