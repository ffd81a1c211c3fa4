#include "parallel/data_parallel/expert_buckets.h"

#include "tensor/ops.h"

namespace loom::parallel {

std::vector<BucketManager*> GradBuffers::all() const {
  if (!experts) return {dense.get()};
  return {dense.get(), experts.get()};
}

std::unique_ptr<BucketManager> take_expert_buckets(std::vector<Tensor>& params, const ExpertParams& experts,
                                                   const MakeBuckets& make) {
  if (!experts.group) return nullptr;
  std::vector<Tensor> dense, held;
  for (const Tensor& p : params) (experts.holds(p) ? held : dense).push_back(p);
  params = std::move(dense);
  broadcast_params(held, *experts.group);  // the experts' replicas start from their group's rank 0
  std::unique_ptr<BucketManager> buckets = make(held, *experts.group);
  buckets->add_before_reduce([&bm = *buckets, scale = experts.grad_scale](int b) {
    const Tensor& g = bm.buckets()[size_t(b)].grad_data;
    if (g.defined()) ops::mul_(g, scale);  // ZeRO-2: undefined when no gradient reached it (zeros are reduced)
  });
  return buckets;
}

}  // namespace loom::parallel
