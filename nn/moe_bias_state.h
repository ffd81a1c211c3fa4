// DeepSeek-V3's routing biases (MoE::score_bias, nn/moe.h) as checkpoint
// state. They are not parameters - no gradient, no optimizer state;
// update_router_bias moves them after each step - but they are part of the
// model: they change which experts a token picks. So a checkpoint saves them
// beside the weights, in the model file, as Megatron's router saves its
// expert_bias buffer and transformers' DeepseekV3 its e_score_correction_bias:
//   "<the MoE layer's path>.score_bias"  [E] fp32, e.g. blocks.0.moe.score_bias
// A model without the bias (no --router-bias-update-rate) saves none.
#pragma once

#include <string>
#include <vector>

#include "nn/module.h"

namespace loom::nn {

// Every routing bias under root, named by its layer's path (root's own names:
// nn::GPT's and parallel::ModelChunks' are the same), sharing storage.
NamedTensors router_biases(Module& root);

// Copies the saved biases (from `source`, for errors) into root's. Returns the
// names of root's biases that saved lacks, left as they are (0 in a fresh
// model): an older checkpoint, or one saved without the bias. Errors, before
// anything is copied: a saved bias whose layer under root has none (a run with
// the bias resumed without it would route differently), or a shape other than [E].
std::vector<std::string> load_router_biases(Module& root, const NamedTensors& saved, const std::string& source);

}  // namespace loom::nn
