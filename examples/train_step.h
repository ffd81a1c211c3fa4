// One training step's forwards and backwards in train_gpt: this rank's rows of
// the global batch, run as K micro-batches whose gradients add up to those of
// the batch mean (each micro-batch's loss is scaled by 1/K before backward).
// Two ways to run them, with the same numbers:
//   accumulate_gradients  the whole model on this process: K forward+backward
//                         passes, the data-parallel sync only on the last
//                         (no_sync() on the others) - gradient accumulation;
//   pipeline_gradients    this rank's stage: the K micro-batches through the
//                         stages on the AFAB or 1F1B schedule, which also
//                         syncs data parallelism on the last backward only.
// forward_backward picks one for the model or stage this rank holds. The
// optimizer step comes after either (train_gpt.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/data.h"
#include "examples/train_setup.h"
#include "nn/gpt.h"
#include "optim/mixed_precision_optimizer.h"
#include "parallel/data_parallel/data_parallel_common.h"
#include "parallel/pipeline_parallel/pipeline_schedule.h"

namespace loom::train {

// Rows [first_row, first_row + K x batch) of the global batch, as K micro-batches of `batch` rows.
std::vector<data::Batch> micro_batches(const data::Batch& global, int64_t first_row, int64_t batch, int64_t K);

// Both return this rank's mean loss over its micro-batches, unscaled (under
// fp16 backward starts from opt.scale_loss(loss), the loss times the scale).
// dp may be null.
double accumulate_gradients(nn::GPT& model, const std::vector<data::Batch>& mbs,
                            const optim::MixedPrecisionOptimizer& opt, parallel::DataParallel* dp);

// schedule: "afab" or "1f1b"; a stage of several chunks (--virtual-stages) runs
// interleaved 1F1B. The loss is the last stage's, the same on every stage.
parallel::PipelineStepResult pipeline_gradients(parallel::PipelineStage& stage, parallel::PipelineP2P& p2p,
                                                const std::vector<data::Batch>& mbs, const std::string& schedule,
                                                const optim::MixedPrecisionOptimizer& opt, parallel::DataParallel* dp);

// One step's gradients on this rank: accumulate_gradients on the whole model,
// or pipeline_gradients on a stage followed by the tied embedding's gradient
// sum across the first and last stage (after the data-parallel sync).
struct StepGradients {
  double loss;                  // this rank's mean loss, unscaled
  parallel::StageEvents events;  // what this pipeline stage ran (--print-schedule); empty without --pp
};
StepGradients forward_backward(ModelOrStage& m, const std::vector<data::Batch>& mbs, const std::string& schedule,
                               const optim::MixedPrecisionOptimizer& opt, DataParallelWrap& dp,
                               parallel::SharedWeightGradHandler& tied);

// The loss to log: the mean over the global batch (all dp ranks).
double global_mean_loss(double local_loss, parallel::ProcessGroupManager& pgm);

}  // namespace loom::train
