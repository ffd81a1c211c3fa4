// The way back of gather_full_state (model.h): every rank fills its own
// parameters from the whole GPT's state dict - its pipeline stage's layers,
// each cut to its tp shard by the shard maps (tensor_parallel/shard_map.h) -
// so a model from outside (a Hugging Face folder, nn/hf_checkpoint.h) starts
// any grid of ranks. Each rank reads the state itself: no communication.
#pragma once

#include "nn/module.h"
#include "parallel/model.h"

namespace loom::parallel {

// full: nn::GPT's names (and shapes). Errors name a parameter the state lacks
// or whose size differs. Converts to the params' dtype and device.
void load_full_state(Model& model, const nn::NamedTensors& full);

}  // namespace loom::parallel
