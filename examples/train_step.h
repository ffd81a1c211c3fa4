// What train_gpt's loop does each step around forward_backward: cut the
// global batch into this rank's micro-batches, scale the loss, average it
// over the data-parallel ranks, and stop when ranks disagree on a skipped
// step or the run diverges (and --inject-overflow, a test aid).
#pragma once

#include <cstdint>
#include <vector>

#include "examples/train_setup.h"

namespace loom::train {

// How one step's global batch is cut: dp ranks x micro-batches of --batch
// rows; micro-batches are --grad-accum on one stage, --microbatches in a pipeline.
struct BatchPlan {
  int64_t micro_batches;  // K
  int64_t global_batch;   // dp x batch x K sequences
  int64_t first_row;      // this dp rank's first row in the global batch
};
BatchPlan plan_batches(const Args& a, const nn::GPTConfig& cfg, parallel::ProcessGroupManager& pgm);
// K: --microbatches (default pp) in a pipeline, else --grad-accum.
int64_t micro_batches_per_step(const Args& a, parallel::ProcessGroupManager& pgm);

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

// Under fp16 a step skipped for overflow must be skipped by every rank (one
// found_inf, reduced over the model's ranks): a rank that decided alone is
// reported and the run stops, naming the ranks on each side, instead of
// training stages of different models (or hanging in ZeRO's all-gather).
void check_ranks_agree_on_skip(int64_t step, const optim::StepResult& s, const optim::MixedPrecisionOptimizer& opt,
                               parallel::ProcessGroupManager& pgm);

// A non-finite loss or grad norm on a step that was not skipped for fp16
// overflow (GradScaler's floor covers those) stops the run naming the step -
// before any save, so a good checkpoint is never overwritten with NaN weights.
void stop_if_diverged(int64_t step, double loss, const optim::StepResult& s);

// A test aid (--inject-overflow), not part of training: an inf in one element
// of rank 0's main_grad buffer (HSDP: and its replicas') before backward adds into it. See train_setup.cpp.
void inject_overflow(const parallel::DataParallelWrap& dp, parallel::ProcessGroupManager& pgm);

}  // namespace loom::train
