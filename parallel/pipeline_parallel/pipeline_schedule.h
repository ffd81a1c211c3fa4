// Pipeline schedules: the order in which a stage runs the forwards and
// backwards of a step's micro-batches and talks to its neighbours (picotron's
// pipeline_parallel.py: train_step_pipeline_afab / train_step_pipeline_1f1b;
// Megatron's schedules.py).
//
// AFAB, all-forward-all-backward (GPipe, Huang et al. 2019): every micro-batch
// forward, then every backward. Simple, but a stage holds the activations of
// all m micro-batches at once.
//
//   stage 0 | F0 F1 F2 F3 .  .  B0 B1 B2 B3          (p 2, m 4; schedule_diagram.h
//   stage 1 | .  F0 F1 F2 F3 B0 B1 B2 B3 .           draws 1F1B on 4 stages)
//
// 1F1B, one-forward-one-backward (PipeDream, Narayanan et al. 2019, in the
// synchronous, flushed form of PipeDream-Flush, 2021, Megatron-LM's default): stage s runs p - s - 1 warm-up forwards, then alternates
// one forward and one backward (steady state), then the remaining backwards
// (cool-down). Same bubble as AFAB, but a stage holds at most p - s
// micro-batches' activations instead of m: the memory saving is the point.
//
// Both schedules (and the interleaved one, interleaved_schedule.h) run each
// micro-batch through a MicroBatchRunner (microbatch_runner.h): the loss exists
// on the last stage only; each micro-batch's loss is scaled by 1/m before
// backward, so the gradients summed over the m backwards are those of the mean
// over the whole batch (the same as one big batch, or gradient accumulation).
// With data parallelism (dp × pp), every
// backward but the last runs inside dp->no_sync(): the gradients are synced
// once, launched bucket by bucket during micro-batch m-1's backward (the last
// one on every stage) and waited for after the schedule's last transfer
// (dp->finish_grad_sync(), Megatron's order), off the pipeline's critical path.
//
// Each forward and backward is recorded as a trace span F<mb> / B<mb>
// (trace.h) and as a ScheduleEvent, for --print-schedule (schedule_diagram.h).
// After the schedule: finalize_model_grads (the tied embedding's gradient sum,
// parallel/finalize_model_grads.h), then the optimizer step (clipping included).
//
// Evaluation (eval_step_pipeline) is AFAB's forward half alone: with no
// backward to come, no activation is kept past its send; the same loss
// broadcast ends it.
#pragma once

#include <vector>

#include "parallel/microbatch_runner.h"

namespace loom::parallel {

// One entry of a rank's schedule: 'F', 'B' (or, split in two by the zero-bubble
// schedules, 'B' and 'W') of micro-batch mb on model chunk chunk.
struct ScheduledOp {
  char kind = 'F';
  int mb = 0, chunk = 0;
  bool operator==(const ScheduledOp&) const = default;
};

// stage: this rank's chunk of the model; dp: the data-parallel wrapper of its
// parameters, or null.
ForwardBackwardResult train_step_pipeline_afab(ModelChunks& stage, PipelineP2P& p2p,
                                               const std::vector<MicroBatch>& micro_batches, const LossFn& loss_fn,
                                               DataParallel* dp = nullptr);
ForwardBackwardResult train_step_pipeline_1f1b(ModelChunks& stage, PipelineP2P& p2p,
                                               const std::vector<MicroBatch>& micro_batches, const LossFn& loss_fn,
                                               DataParallel* dp = nullptr);

// The validation loss of a pipeline: every micro-batch's forward in order
// (AFAB without the backward), under NoGradGuard, so it records no graph,
// holds no activation past its send and leaves no .grad. Returns the mean loss
// over the micro-batches, computed on the last stage and broadcast over the pp
// group: the same number on every stage. Putting the stage in eval mode
// (stage.eval(): dropout off) is the caller's job, as with model.eval() in PyTorch.
double eval_step_pipeline(ModelChunks& stage, PipelineP2P& p2p, const std::vector<MicroBatch>& micro_batches,
                          const LossFn& loss_fn);

}  // namespace loom::parallel
