// The validation loss train_gpt logs: the mean cross-entropy over a few
// batches of the held-out split, drawn from a generator of its own (so an
// evaluation never shifts the training data), in eval mode, without autograd.
#pragma once

#include <cstdint>

#include "data/data.h"
#include "nn/gpt.h"
#include "parallel/pipeline_parallel/pipeline_p2p.h"
#include "parallel/pipeline_parallel/pipeline_stage.h"

namespace loom::train {

struct EvalBatches {
  int64_t batch;    // sequences per batch
  int64_t batches;  // how many
  uint64_t seed;    // of the batches' generator
};

// The whole model on this process.
double evaluate(nn::GPT& model, const data::TextDataset& ds, const EvalBatches& eb);

// Through the pipeline: the stages run the forwards of the same batches
// (parallel::eval_step_pipeline) and every stage returns the mean loss.
// Collective over the pipeline group.
double evaluate_pipeline(parallel::PipelineStage& stage, parallel::PipelineP2P& p2p, const data::TextDataset& ds,
                         const EvalBatches& eb);

}  // namespace loom::train
