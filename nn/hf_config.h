// config.json of a Hugging Face model folder <-> loom's GPTConfig, so that
// `from_pretrained` builds the same model loom trains and loom builds the
// model a `save_pretrained` folder describes. Two families, each a
// reader/writer pair here and a name table in hf_checkpoint.cpp:
//   GPT-2 (model_type "gpt2", GPT2LMHeadModel)    loom's --arch gpt2
//   Llama (model_type "llama", LlamaForCausalLM)  loom's --arch llama (tied or not)
//
// What loom fixes and a config.json may not change (refused, naming the key
// and the value). GPT-2: GELU's tanh form (activation_function gelu_new),
// layer_norm_epsilon 1e-5, an MLP of 4 n_embd (n_inner null), attention scaled
// by 1/sqrt(head dim) and not by layer, a tied LM head, and one dropout
// probability for embeddings, attention and residuals. Llama: hidden_act
// silu, no rope_scaling, no attention_bias or mlp_bias, head_dim
// hidden_size / num_attention_heads, attention_dropout 0.
#pragma once

#include <string>

#include "nn/gpt.h"

namespace loom::nn {

// The family of cfg's blocks under HF's names: "gpt2" (arch() gpt2), "llama"
// (RMSNorm, RoPE, SwiGLU, no biases; tied or untied head), else an error
// naming the mix (a "custom" model has no HF class to load it).
std::string hf_family(const GPTConfig& cfg);

// Reads path (a config.json). Errors name the file, the key and the value.
GPTConfig read_hf_config(const std::string& path);

// The config.json text of cfg as GPT2LMHeadModel or LlamaForCausalLM, with torch_dtype the
// parameters' dtype ("float32", "bfloat16", "float16").
std::string hf_config_json(const GPTConfig& cfg, DType dtype);

}  // namespace loom::nn
