// The validation loss train_gpt logs: the mean cross-entropy over a few
// batches of the held-out split, drawn from a generator of its own (so an
// evaluation never shifts the training data), in eval mode, without autograd,
// through the pipeline when there is one (parallel::forward_only).
#pragma once

#include <cstdint>

#include "data/data.h"
#include "parallel/model.h"

namespace loom::train {

struct EvalBatches {
  int64_t batch;    // sequences per batch
  int64_t batches;  // how many
  uint64_t seed;    // of the batches' generator
  int64_t eod;      // --eod-mask-loss's token (-1: off): its targets' losses left out, as in training
};

// Every rank of a replica returns the same mean loss. Collective over the
// model-parallel group (the pipeline's stages, the tp ranks), and over cp when
// given (each cp rank runs its zig-zag chunks of the sequences; the mean is over all).
double evaluate(parallel::Model& m, const data::TextDataset& ds, const EvalBatches& eb,
                parallel::ProcessGroup* cp = nullptr);

}  // namespace loom::train
