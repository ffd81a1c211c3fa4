// The step's loss as the mean over every target token of the global batch,
// wherever the tokens sit (Megatron's per-token loss: sum the losses and the
// token counts, then divide).
//
// Each micro-batch's loss is the mean over its own targets (nn/loss.h). When
// every micro-batch holds as many targets as the next, the mean of those
// means - over the K micro-batches (MicroBatchRunner's 1/K), then over the
// R ranks of the dp x cp group (the gradient's and the loss's Avg) - is the
// global mean. Once targets can be ignored (--eod-mask-loss) the counts
// differ, and a mean of means weighs a rank's few tokens as much as another's
// many: not what one process computes. So each micro-batch's mean is first
// multiplied by
//     w = count * R * K / global_count
// and (1/R) sum_r (1/K) sum_k w * mean = sum of all token losses / global_count.
// With equal counts w is exactly 1 and the loss is left untouched.
#pragma once

#include <cstdint>
#include <vector>

#include "parallel/microbatch_runner.h"

namespace loom::parallel {

class ProcessGroup;

// Targets that are not ignore_index in targets [b, T].
int64_t target_count(const Tensor& targets, int64_t ignore_index = -100);

// The step's targets: this rank's micro-batches summed over `group` (the ranks
// whose losses are averaged: dp x cp for training, cp for evaluation; null = this rank).
int64_t global_target_count(const std::vector<MicroBatch>& micro_batches, ProcessGroup* group);

// mean_loss's result, weighted as above. ranks = R, micro_batches = K. A
// micro-batch whose every target is ignored adds zero (its mean would be NaN)
// and still back-propagates, so a pipeline's stages exchange their usual tensors.
LossFn per_token_loss(LossFn mean_loss, int64_t global_count, int ranks, int64_t micro_batches);

}  // namespace loom::parallel
