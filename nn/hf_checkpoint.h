// Hugging Face model folders, both ways: a folder written by transformers'
// `save_pretrained` loads into loom's GPT, and one loom writes loads with
// `from_pretrained`. The folder:
//   config.json                      the architecture (hf_config.h)
//   model.safetensors                every tensor under HF's names, or, sharded:
//   model-00001-of-00003.safetensors ...  and
//   model.safetensors.index.json     {"metadata": {"total_size": bytes},
//                                     "weight_map": {"<hf name>": "<shard file>", ...}}
// The name map is one table per architecture (hf_names): loom's name, HF's
// name, the shape loom holds, whether HF stores the matrix transposed, and
// which of loom's rows HF's tensor holds.
// GPT-2's Conv1D layers keep their weight as [in, out] (x @ W), loom's Linear
// as [out, in] (x @ Wᵀ), so c_attn, c_proj and c_fc are transposed on the way
// in and out; GPT-2's lm_head is wte itself (tied) and is not stored.
// Llama's nn.Linear layers are [out, in] like loom's (not transposed), and
// loom's fused c_attn [(H + 2 Hkv) hd, C] is HF's q_proj [H hd, C], k_proj and
// v_proj [Hkv hd, C] stacked by rows, heads in the same order; RoPE is the
// same rotate-half form on both sides, so no row permutation is needed.
// lm_head.weight is stored only when the head is untied.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "nn/module.h"

namespace loom::nn {

// One HF tensor: loom's name and shape, HF's name, whether HF's tensor is
// loom's transposed (shape reversed), and, when row_count > 0, that it holds
// only loom's rows [row_begin, row_begin + row_count) (Llama's q, k and v).
struct HfName {
  std::string loom, hf;
  Shape loom_shape;
  bool transposed = false;
  int64_t row_begin = 0, row_count = 0;
};

// Every HF tensor of cfg's model (GPT-2 or Llama, nn/hf_config.h's
// hf_family), in loom's order (nn::GPT::named_parameters); a parameter cut in
// rows appears once per piece, in row order.
std::vector<HfName> hf_names(const GPTConfig& cfg);

struct HfCheckpoint {
  GPTConfig cfg;       // from config.json
  NamedTensors state;  // loom's names, shapes and order; fp32
};

// Reads dir/config.json and its tensors (one file, or the shards its index
// lists). Errors name the file and the tensor: a missing config, shard or
// tensor, a shape that is not the config's, a tensor loom has no place for.
HfCheckpoint load_hf_checkpoint(const std::string& dir);

// Writes state (loom's names: nn::GPT's parameters, or parallel::gather_full_state)
// as an HF folder. max_shard_bytes > 0: shards of at most that many bytes
// (a larger tensor gets a shard of its own) and their index. The folder is
// written as dir.tmp (a leftover of a crashed save is removed first) and
// renamed to dir; an earlier folder at dir is moved to dir.old, and removed,
// only once the new one is complete. tokenizer_json: copied in as
// tokenizer.json (a run's --tokenizer), when not empty.
void save_hf_checkpoint(const std::string& dir, const GPTConfig& cfg, const NamedTensors& state,
                        int64_t max_shard_bytes = 0, const std::string& tokenizer_json = "");

}  // namespace loom::nn
