// What every pipeline schedule does with one micro-batch on one model chunk;
// the schedules (pipeline_schedule.h, interleaved_schedule.h) differ only in
// the order they call forward() and backward() and in how they pair the
// transfers. The runner keeps each forward's input and output until its
// backward - these are the activations a schedule holds, the number the
// schedules exist to bound - and logs what ran, for --print-schedule.
//
// The loss exists on the last virtual stage only; each micro-batch's loss is
// scaled by 1/m before backward, so the gradients summed over the m backwards
// are those of the mean over the whole batch (the same as one big batch, or
// gradient accumulation).
#pragma once

#include <map>
#include <utility>
#include <vector>

#include "parallel/pipeline_parallel/pipeline_schedule.h"

namespace loom::parallel {

class MicroBatchRunner {
 public:
  // Begins the schedule's transfers (p2p.begin_schedule()).
  // Errors: no micro-batches, a stage that does not match its pp rank,
  // micro-batches of different shapes (a schedule sends each header once).
  MicroBatchRunner(PipelineStage& stage, PipelineP2P& p2p, const std::vector<MicroBatch>& mbs, const LossFn& loss_fn,
                   DataParallel* dp);
  int num_microbatches() const { return int(mbs_.size()); }

  // Micro-batch mb's forward on chunk's layers, from `input` (received;
  // undefined on the first virtual stage, which reads the token ids). Returns
  // what goes downstream: the activation, or on the last virtual stage the
  // loss scaled by 1/m.
  Tensor forward(int mb, const Tensor& input, int chunk = 0);

  // Micro-batch mb's backward on chunk from output_grad (received; undefined
  // on the last virtual stage, which starts from its loss). Returns d loss /
  // d input, to send upstream. sync = false runs it inside dp->no_sync();
  // sync = true launches the dp reductions (dp->defer_grad_sync()), and
  // finish() waits for them.
  Tensor backward(int mb, const Tensor& output_grad, bool sync, int chunk = 0);

  // After the last transfer: waits for this stage's sends
  // (p2p.end_schedule()), finishes the dp gradient sync, then gives every stage the mean loss.
  PipelineStepResult finish();

 private:
  // A received tensor must have the shape this stage computes with: a rank
  // started with other --embd / --batch / --block sends another shape, which
  // would fail deep inside a matmul or, worse, broadcast silently.
  void expect_received(const char* what, int mb, const Tensor& t, const Shape& want) const;

  PipelineStage& stage_;
  PipelineP2P& p2p_;
  const std::vector<MicroBatch>& mbs_;
  const LossFn& loss_fn_;
  DataParallel* dp_;
  std::map<std::pair<int, int>, std::pair<Tensor, Tensor>> in_flight_;  // (mb, chunk) -> (input, output)
  double loss_sum_ = 0;
  StageEvents events_;
};

// The loss exists on the last stage only; rank 0, which prints, is the first.
// Every stage returns the last stage's mean over the m micro-batches.
double broadcast_mean_loss(PipelineP2P& p2p, double loss_sum, int m);

// Throws unless the stage's first/last virtual stages sit on pp rank 0 / p - 1.
void check_stage_matches_rank(const PipelineStage& stage, const PipelineP2P& p2p);

}  // namespace loom::parallel
