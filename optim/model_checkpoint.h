// The checkpoint of a training run, for this rank's parallel::Model whatever
// the grid: which rank writes what, decided here (optim/checkpoint.h writes it).
//   the model     the whole GPT on global rank 0: the pipeline's stages
//                 gathered, the tp shards joined (parallel::gather_full_state)
//   optimizer     replicas (dp x cp ranks) hold identical state, so dp and cp
//                 rank 0 writes it - or, under ZeRO, every rank of the group the
//                 optimizer shards over (opt.shard_group(): dp x cp) its own
//                 shard (HSDP: the shard group's, the first replica writing);
//                 under tp each stage's state is joined into full
//                 tensors over that group and tp, and written by its rank 0 of
//                 both (tp rank 0's replicated params are saved, after checking
//                 that every tp rank's are the same bits); under ep each ep
//                 rank of the first expert-dp replica writes (its experts, and a
//                 copy of the replicated state; under tp and ZeRO the experts are
//                 joined over expert-dp, the rest over dp and written once)
//   train state   steps done, the data generator, the dropout offset
// Loading reads the shards this rank needs and reshards when dp, pp, tp or
// ZeRO changed (optim/checkpoint.h).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "optim/checkpoint.h"
#include "parallel/model.h"

namespace loom::optim {

// Collective over the world. Creates path's folder.
void save_model_checkpoint(const std::string& path, parallel::Model& m, MixedPrecisionOptimizer& opt,
                           const nn::GPTConfig& cfg, const std::string& vocab_utf8, int64_t steps_done,
                           const std::array<uint64_t, 4>& data_rng, parallel::ProcessGroupManager& pgm);

// Fills the optimizer (fp32 main params, AdamW state, loss scale) and the
// model's params, and puts the dropout offset where the saved run had it.
// Returns the train state (the caller restores its data generator).
TrainState load_model_checkpoint(const std::string& path, parallel::Model& m, MixedPrecisionOptimizer& opt);

}  // namespace loom::optim
