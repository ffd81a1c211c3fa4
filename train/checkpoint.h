// train_gpt's checkpoints in and out: --init-from and --resume read one
// before training, --save and --export-hf write one (loom's sharded set,
// optim/model_checkpoint.h; Hugging Face's folder, nn/hf_checkpoint.h).
#pragma once

#include <cstdint>

#include "optim/mixed_precision_optimizer.h"
#include "parallel/model.h"
#include "parallel/process_group_manager.h"
#include "tensor/generator.h"
#include "train/args.h"
#include "train/corpus.h"

namespace loom::train {

// --init-from DIR: the Hugging Face folder's weights into this rank's layers
// (nn/hf_checkpoint.h, parallel/load_full_state.h), before the dtype cast
// and the optimizer's fp32 copy. A no-op without the flag.
void init_from_hf(const Args& a, parallel::Model& m, parallel::ProcessGroupManager& pgm);

// --export-hf DIR: the whole model as a Hugging Face folder, written by rank 0
// (dir.tmp, then renamed), from the last step's params (opt's param sync
// finished first, as a --save does). Collective over world. A no-op without the flag.
void export_hf(const Args& a, const Corpus& c, parallel::Model& m, optim::MixedPrecisionOptimizer& opt,
               parallel::ProcessGroupManager& pgm);

// --resume: fills the optimizer (fp32 main params, AdamW state, loss scale)
// and the model params from the checkpoint's shards, resharding when dp, pp or
// --zero changed, and puts the data generator where it was. Returns the steps
// already done (0 without --resume).
int64_t resume(const Args& a, optim::MixedPrecisionOptimizer& opt, parallel::Model& m, Generator& data_gen);

// --save: the whole model on rank 0 (a pipeline's stages gathered) and every
// rank's optimizer shard (optim/checkpoint.h). Collective over world.
void save(const Args& a, int64_t steps_done, const Corpus& c, parallel::Model& m, optim::MixedPrecisionOptimizer& opt,
          const Generator& data_gen, parallel::ProcessGroupManager& pgm);

}  // namespace loom::train
