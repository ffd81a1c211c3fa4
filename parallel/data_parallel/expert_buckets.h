// The experts' gradient buffer (expert parallelism; Megatron's expert_parallel_buffers
// and expert_gradient_scaling_factor). The experts this rank holds (ExpertParams,
// data_parallel_common.h) are replicated only over their expert-dp group (dp / ep
// ranks), so DataParallelBucket keeps them out of its buffer over dp and puts them in
// a second BucketManager over that group, built as the first (all-reduced, or under
// ZeRO-1/2 reduce-scattered: zero_data_parallel_bucket.h). Each expert's gradient
// already sums the tokens of its ep group, so each bucket is scaled by
// grad_scale = 1 / ep as its reduction is launched:
// the average over expert-dp then is (1/dp) Σ over every rank's tokens, as every other
// gradient's average over dp.
#pragma once

#include <memory>
#include <vector>

#include "parallel/data_parallel/data_parallel_bucket.h"

namespace loom::parallel {

// Takes the experts out of params (the rest stay, in order), broadcasts them from their
// group's rank 0 (collective over experts.group) and returns their buffer, built by make;
// null, with params untouched, when experts.group is null.
std::unique_ptr<BucketManager> take_expert_buckets(std::vector<Tensor>& params, const ExpertParams& experts,
                                                   const DataParallelBucket::MakeBuckets& make);

}  // namespace loom::parallel
