// What train_gpt's loop does each step around forward_backward: cut the
// global batch into this rank's micro-batches, scale the loss, and average it
// over the data-parallel ranks. What stops a run that went wrong (ranks that
// disagree on a skipped step, divergence): train/guards.h.
#pragma once

#include <cstdint>
#include <vector>

#include "data/data.h"
#include "optim/mixed_precision_optimizer.h"
#include "parallel/microbatch_runner.h"
#include "parallel/model.h"
#include "parallel/process_group_manager.h"
#include "train/args.h"

namespace loom::train {

// How one step's global batch is cut: dp ranks x micro-batches of --batch
// rows; micro-batches are --grad-accum on one stage, --microbatches in a pipeline.
struct BatchPlan {
  int64_t micro_batches;  // K
  int64_t global_batch;   // dp x batch x K sequences
  int64_t first_row;      // this dp rank's first row in the global batch
};
BatchPlan plan_batches(const Args& a, const nn::GPTConfig& cfg, parallel::ProcessGroupManager& pgm);

// Rows [first_row, first_row + K x batch) of the global batch, as K micro-batches of `batch` rows.
// With cp > 1 each micro-batch holds cp rank cp_rank's zig-zag chunks of its sequences.
std::vector<parallel::MicroBatch> micro_batches(const data::Batch& global, int64_t first_row, int64_t batch, int64_t K,
                                                int cp = 1, int cp_rank = 0);

// The loss back-propagated for one micro-batch of mbs: the model's loss
// (vocab-parallel under tp), times the loss scale under fp16. With targets
// masked (--eod-mask-loss) each micro-batch's mean is weighted by its target
// count, so the step's loss is the mean over every kept target of the global
// batch (parallel/per_token_loss.h), as one process computes it.
parallel::LossFn scaled_loss(parallel::Model& m, const optim::MixedPrecisionOptimizer& opt,
                             const std::vector<parallel::MicroBatch>& mbs, bool masked,
                             parallel::ProcessGroupManager& pgm);

// The loss to log: this rank's mean over its micro-batches with the loss
// scale divided out (a power of two: exact), averaged over the dp ranks.
double global_mean_loss(double local_loss, const optim::MixedPrecisionOptimizer& opt,
                        parallel::ProcessGroupManager& pgm);

}  // namespace loom::train
