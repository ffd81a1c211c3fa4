// What every schedule does with one micro-batch on one model chunk (Megatron's
// forward_step / backward_step): gradient accumulation on one stage
// (forward_backward.h) and the pipeline schedules (pipeline_schedule.h,
// interleaved_schedule.h) differ only in the order they call forward() and
// backward() and in how they pair the transfers. The runner keeps each
// forward's input and output until its backward - these are the activations a
// schedule holds, the number the pipeline schedules exist to bound - and logs
// what ran, for --print-schedule.
//
// The loss exists on the last chunk only; each micro-batch's loss is scaled by
// 1/m before backward - here, and nowhere else - so the gradients summed over
// the m backwards are those of the mean over the whole batch (the same as one
// big batch).
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "parallel/data_parallel/data_parallel_common.h"
#include "parallel/model_chunks.h"
#include "parallel/pipeline_parallel/pipeline_p2p.h"
#include "parallel/trace/schedule_recorder.h"

namespace loom::parallel {

// One micro-batch of this data-parallel rank's rows: x = token ids [b, T]
// (read by the first chunk), y = targets [b, T] (read by the last).
struct MicroBatch {
  Tensor x, y;
};

// The loss on the last chunk: (logits [b, T, V], targets [b, T]) -> scalar.
using LossFn = std::function<Tensor(const Tensor& logits, const Tensor& targets)>;

struct ForwardBackwardResult {
  double loss = 0;     // mean over the micro-batches; the same on every stage (broadcast from the last)
  StageEvents events;  // what this rank ran, in order
};

class MicroBatchRunner {
 public:
  // p2p: the pipeline's links (null without a pipeline); begins the
  // schedule's transfers (p2p->begin_schedule()). dp may be null.
  // Errors: no micro-batches, chunks that do not match the pp rank,
  // micro-batches of different shapes (a schedule sends each header once).
  MicroBatchRunner(ModelChunks& model, PipelineP2P* p2p, const std::vector<MicroBatch>& mbs, const LossFn& loss_fn,
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

  // backward() in the two halves of a zero-bubble schedule (autograd/engine.h):
  // B returns d loss / d input and leaves the weights' gradients; W computes
  // them, and the data-parallel hooks fire then (sync as in backward()).
  Tensor backward_input(int mb, const Tensor& output_grad, int chunk = 0);
  void backward_weight(int mb, bool sync, int chunk = 0);

  // After the last transfer: waits for this stage's sends
  // (p2p->end_schedule()), finishes the dp gradient sync, then gives every stage the mean loss.
  ForwardBackwardResult finish();

 private:
  // A received tensor must have the shape this stage computes with: a rank
  // started with other --embd / --batch / --block sends another shape, which
  // would fail deep inside a matmul or, worse, broadcast silently.
  void expect_received(const char* what, int mb, const Tensor& t, const Shape& want) const;
  // Micro-batch mb's (input, output) on chunk, no longer in flight: its backward runs.
  std::pair<Tensor, Tensor> take_in_flight(int mb, const Tensor& output_grad, int chunk);
  // Runs fn (a backward, or W) inside dp->no_sync() (sync false) or dp->defer_grad_sync().
  void with_dp_sync(bool sync, const std::function<void()>& fn);

  ModelChunks& model_;
  PipelineP2P* p2p_;
  const std::vector<MicroBatch>& mbs_;
  const LossFn& loss_fn_;
  DataParallel* dp_;
  // (mb, chunk) -> (input, output); locked: an overlapped pair's F adds one while its B takes another (overlapped_pairs.h)
  std::mutex in_flight_mutex_;
  std::map<std::pair<int, int>, std::pair<Tensor, Tensor>> in_flight_;
  std::map<std::pair<int, int>, autograd::WeightGrads> weight_grads_;    // (mb, chunk) -> what B left for W
  double loss_sum_ = 0;
  ScheduleRecorder recorder_;
};

// The loss exists on the last stage only (pp rank p - 1, or 0 in a V); rank 0, which prints, is the first.
// Every stage returns the last stage's mean over the m micro-batches (no
// pipeline, p2p null: this rank's own).
double broadcast_mean_loss(PipelineP2P* p2p, double loss_sum, int m);

// Throws unless the model's first/last chunks sit on pp rank 0 / p - 1 (0 in a V)
// (without a pipeline: unless this rank holds every layer).
void check_stage_matches_rank(const ModelChunks& model, const PipelineP2P* p2p);

}  // namespace loom::parallel
