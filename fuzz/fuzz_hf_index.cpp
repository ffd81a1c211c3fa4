// libFuzzer target: a model folder's model.safetensors.index.json (which shard
// holds which tensor) on arbitrary bytes, beside a valid config.json and no
// shards, through nn::load_hf_checkpoint. Every input names at best a shard
// that is not there, so the load must throw loom::Error naming the index or
// the shard - never crash, read outside the folder's files or throw anything else.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fuzz/fuzz_input.h"
#include "nn/hf_checkpoint.h"
#include "tensor/error.h"

namespace {
// GPT-2's smallest shape: the config is fixed, the index is the input.
const std::string kConfig = R"({"model_type": "gpt2", "vocab_size": 37, "n_positions": 16, "n_embd": 12,
  "n_layer": 1, "n_head": 3, "architectures": ["GPT2LMHeadModel"]})";
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string config = loom::fuzz::write_input("config.json", reinterpret_cast<const uint8_t*>(kConfig.data()),
                                                     kConfig.size());
  const std::string index = loom::fuzz::write_input("model.safetensors.index.json", data, size);
  try {
    loom::nn::load_hf_checkpoint(std::filesystem::path(index).parent_path().string());
  } catch (const loom::Error&) {
    return 0;  // refused with a message: the only outcome without shards
  }
  std::abort();  // a folder without one tensor file loaded
}
