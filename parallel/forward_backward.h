// One training step's forwards and backwards on this rank (Megatron's
// get_forward_backward_func): the rank's rows of the global batch, as m
// micro-batches whose gradients add up to those of the batch mean.
//   pp = 1   forward_backward_no_pipelining: gradient accumulation - m
//            forward+backward passes, the data-parallel sync on the last
//            only (no_sync() on the others)
//   pp > 1   the pipeline schedule: "afab" or "1f1b"
//            (pipeline_parallel/pipeline_schedule.h), "zb-h1"
//            (zero_bubble_schedule.h), "zb-v" (zbv_schedule.h) or "dualpipev"
//            (dualpipev_schedule.h) on two chunks in a V, or interleaved 1F1B
//            when the rank holds several chunks (interleaved_schedule.h)
// Either way the micro-batches run through one MicroBatchRunner
// (microbatch_runner.h), which scales each loss by 1/m. After it:
// finalize_model_grads.h, then the optimizer step.
#pragma once

#include <string>
#include <vector>

#include "parallel/microbatch_runner.h"
#include "parallel/model.h"

namespace loom::parallel {

// loss_fn: the loss to back-propagate for one micro-batch (the model's loss,
// times the loss scale under fp16). dp may be null. The result's loss is the
// mean of loss_fn over the micro-batches (as computed; divide out a loss scale).
// overlap_pairs: DualPipeV's pairs compute at once (overlapped_pairs.h).
ForwardBackwardResult forward_backward(Model& model, const std::vector<MicroBatch>& micro_batches,
                                       const std::string& schedule, const LossFn& loss_fn, DataParallel* dp,
                                       bool overlap_pairs = false);

// Gradient accumulation on a rank that holds every layer.
ForwardBackwardResult forward_backward_no_pipelining(ModelChunks& model, const std::vector<MicroBatch>& micro_batches,
                                                     const LossFn& loss_fn, DataParallel* dp);

// The mean of model.loss over the micro-batches, forwards only, under
// NoGradGuard (through the pipeline when pp > 1: every stage returns the
// same number). Putting the model in eval mode is the caller's job.
double forward_only(Model& model, const std::vector<MicroBatch>& micro_batches);
// The same with another loss per micro-batch (per_token_loss.h's weighting).
double forward_only(Model& model, const std::vector<MicroBatch>& micro_batches, const LossFn& loss_fn);

}  // namespace loom::parallel
