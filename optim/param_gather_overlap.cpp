#include "optim/param_gather_overlap.h"

#include <set>
#include <unordered_set>

#include "optim/distributed_optimizer.h"

namespace loom::optim {

ParamGatherOverlap::ParamGatherOverlap(DistributedOptimizer& opt, const std::vector<std::shared_ptr<nn::Layer>>& layers) {
  const parallel::BucketManager& bm = opt.bucket_manager();
  std::unordered_set<const TensorImpl*> bucketed;  // params that require grad (the others are never gathered)
  for (const parallel::Bucket& b : bm.buckets())  // not expert parallelism's experts: whole, never gathered
    for (const Tensor& p : b.params) bucketed.insert(p.impl());
  for (const auto& layer : layers) {
    std::set<int> buckets;
    for (const Tensor& p : layer->parameters())
      if (bucketed.count(p.impl())) buckets.insert(bm.bucket_of(p));
    buckets_of_layer_.emplace_back(buckets.begin(), buckets.end());
    hooks_.push_back(layer->register_forward_pre_hook(
        [&opt, mine = buckets_of_layer_.back()](nn::Module&, const Tensor&) {
          for (int b : mine) opt.wait_param_gather(b);  // a no-op once waited
        }));
  }
}

}  // namespace loom::optim
