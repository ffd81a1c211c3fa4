// config.json of a Hugging Face model folder <-> loom's GPTConfig, so that
// `from_pretrained` builds the same model loom trains and loom builds the
// model a `save_pretrained` folder describes. GPT-2 (model_type "gpt2",
// GPT2LMHeadModel) today; another architecture is one more reader/writer pair
// here and one more name table in hf_checkpoint.cpp.
//
// What loom's GPT fixes and a config.json may not change (refused, naming the
// key and the value): GELU's tanh form (activation_function gelu_new),
// layer_norm_epsilon 1e-5, an MLP of 4 n_embd (n_inner null), attention scaled
// by 1/sqrt(head dim) and not by layer, a tied LM head, and one dropout
// probability for embeddings, attention and residuals.
#pragma once

#include <string>

#include "nn/gpt.h"

namespace loom::nn {

// Reads path (a config.json). Errors name the file, the key and the value.
GPTConfig read_hf_config(const std::string& path);

// The config.json text of cfg as GPT2LMHeadModel, with torch_dtype the
// parameters' dtype ("float32", "bfloat16", "float16").
std::string hf_config_json(const GPTConfig& cfg, DType dtype);

}  // namespace loom::nn
