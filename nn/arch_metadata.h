// A GPTConfig's architecture (the Llama set's fields, nn/gpt.h) as string
// metadata, the keys a checkpoint's safetensors header carries
// (optim/checkpoint.h): written by arch_metadata, read back by read_arch_metadata.
#pragma once

#include <map>
#include <string>

#include "nn/gpt.h"

namespace loom::nn {

// The architecture fields as strings: empty for GPT-2's defaults (so GPT-2
// checkpoints stay as they were).
std::map<std::string, std::string> arch_metadata(const GPTConfig& cfg);
// Sets cfg's architecture fields from meta; a missing key keeps its GPT-2
// default. Errors: a value that is not a number.
void read_arch_metadata(GPTConfig& cfg, const std::map<std::string, std::string>& meta);

}  // namespace loom::nn
