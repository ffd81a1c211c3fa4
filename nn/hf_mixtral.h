// Hugging Face's MixtralForCausalLM (model_type "mixtral") beside Llama: the
// same attention, norms and RoPE, and in each layer's MLP place a
// block_sparse_moe (loom's nn::MoE), stored per expert by transformers 4.x and
// 5.x alike (5.x fuses them in memory and splits them again on save):
//   model.layers.N.block_sparse_moe.gate.weight          [E, C]  loom: blocks.N.moe.gate.weight
//   model.layers.N.block_sparse_moe.experts.M.w1.weight  [I, C]  loom: blocks.N.moe.experts.M.w1.weight
//   ... .w2.weight [C, I], .w3.weight [I, C]                     (w2, w3 likewise)
// config.json adds num_local_experts (E) and num_experts_per_tok (k) to
// Llama's keys; intermediate_size is each expert's width. Refused:
// router_jitter_noise other than 0 (a training-time noise loom does not draw)
// and a sliding_window (loom's attention sees the whole block). MixtralConfig's
// defaults differ from LlamaConfig's: rope_theta 1e6, rms_norm_eps 1e-5.
// (Internal to nn/: hf_config.cpp and hf_checkpoint.cpp.)
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/hf_checkpoint.h"

namespace loom::nn {

// What a Llama-family config.json means where a key is absent.
struct LlamaFamilyDefaults {
  const char* architecture;
  const char* model_type;
  double rms_norm_eps, rope_theta;
};
inline constexpr LlamaFamilyDefaults kLlamaDefaults{"LlamaForCausalLM", "llama", 1e-6, 10000.0};
inline constexpr LlamaFamilyDefaults kMixtralDefaults{"MixtralForCausalLM", "mixtral", 1e-5, 1e6};

// Sets cfg.moe from config c's Mixtral keys (errors name path, the key and the value).
void read_mixtral_experts(const nlohmann::ordered_json& c, const std::string& path, GPTConfig& cfg);
// Adds the Mixtral keys of cfg to c.
void write_mixtral_experts(const GPTConfig& cfg, nlohmann::ordered_json& c);
// Appends block i's MoE tensors (l: loom's "blocks.i.", h: HF's "model.layers.i.") to t.
void append_mixtral_names(const GPTConfig& cfg, const std::string& l, const std::string& h, std::vector<HfName>& t);

}  // namespace loom::nn
