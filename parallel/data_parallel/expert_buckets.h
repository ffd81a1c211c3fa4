// The experts' gradient buffer (expert parallelism; Megatron's expert_parallel_buffers
// and expert_gradient_scaling_factor). The experts this rank holds (ExpertParams,
// data_parallel_common.h) are replicated only over their expert-dp group (dp / ep
// ranks), so DataParallelBucket keeps them out of its buffer over dp and puts them in
// a second BucketManager over that group, built as the first (all-reduced, or under
// ZeRO-1/2 reduce-scattered: zero_data_parallel_bucket.h). Each expert's gradient
// already sums the tokens of its ep group, so each bucket is scaled by
// grad_scale = 1 / ep as its reduction is launched:
// the average over expert-dp then is (1/dp) Σ over every rank's tokens, as every other
// gradient's average over dp. GradBuffers holds both buffers and routes each param to its own.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "parallel/data_parallel/bucket.h"
#include "parallel/data_parallel/data_parallel_common.h"

namespace loom::parallel {

// How a buffer is built from its params and group: all-reduced buckets (BucketManager, by default) or
// reduce-scattered ones (ZeroDataParallelBucket's: make_sharded_buckets, grad_shards.h).
using MakeBuckets = std::function<std::unique_ptr<BucketManager>(const std::vector<Tensor>&, ProcessGroup&)>;

// DataParallelBucket's buffers (Megatron's buffers and expert_parallel_buffers): the dense
// params' over dp and, with experts kept apart, theirs over expert-dp. Each param is in one.
struct GradBuffers {
  std::unique_ptr<BucketManager> dense;    // over dp
  std::unique_ptr<BucketManager> experts;  // over expert-dp; null without experts kept apart
  bool kept_apart(const Tensor& p) const { return experts && experts->holds(p); }  // p is one of the experts
  BucketManager& of(const Tensor& p) const { return kept_apart(p) ? *experts : *dense; }  // the buffer p is in
  std::vector<BucketManager*> all() const;  // dense, then experts if any
};

// Takes the experts out of params (the rest stay, in order), broadcasts them from their
// group's rank 0 (collective over experts.group) and returns their buffer, built by make;
// null, with params untouched, when experts.group is null.
std::unique_ptr<BucketManager> take_expert_buckets(std::vector<Tensor>& params, const ExpertParams& experts,
                                                   const MakeBuckets& make);

}  // namespace loom::parallel
