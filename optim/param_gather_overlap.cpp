#include "optim/param_gather_overlap.h"

#include <set>
#include <unordered_set>

#include "optim/distributed_optimizer.h"

namespace loom::optim {

ParamGatherOverlap::ParamGatherOverlap(DistributedOptimizer& opt, const std::vector<std::shared_ptr<nn::Layer>>& layers) {
  // The buckets of bm holding each layer's params (those that require grad: the others are never gathered).
  auto buckets_of = [&](const parallel::BucketManager* bm, const nn::Layer& layer) {
    std::unordered_set<const TensorImpl*> bucketed;
    for (const parallel::Bucket& b : bm ? bm->buckets() : std::vector<parallel::Bucket>{})
      for (const Tensor& p : b.params) bucketed.insert(p.impl());
    std::set<int> buckets;
    for (const Tensor& p : layer.parameters())
      if (bucketed.count(p.impl())) buckets.insert(bm->bucket_of(p));
    return std::vector<int>(buckets.begin(), buckets.end());
  };
  for (const auto& layer : layers) {
    buckets_of_layer_.push_back(buckets_of(&opt.bucket_manager(), *layer));
    // Expert parallelism's experts, in their own buffer gathered over expert-dp (a MoE block's).
    std::vector<int> experts = buckets_of(opt.expert_bucket_manager(), *layer);
    hooks_.push_back(layer->register_forward_pre_hook(
        [&opt, mine = buckets_of_layer_.back(), experts](nn::Module&, const Tensor&) {
          for (int b : mine) opt.wait_param_gather(b);  // a no-op once waited
          for (int b : experts) opt.wait_param_gather(b, /*experts=*/true);
        }));
  }
}

}  // namespace loom::optim
