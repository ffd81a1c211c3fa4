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
// silu, plain RoPE (rope_type "default": no linear, dynamic, yarn, llama3 or
// longrope scaling), no attention_bias or mlp_bias, head_dim
// hidden_size / num_attention_heads, attention_dropout 0, every layer_types
// entry "full_attention".
//
// transformers 4.x and 5.x write some keys differently; loom reads both and
// writes both, so that 4.40 and 5.x load its folders alike:
//   RoPE's θ     4.x: "rope_theta" (+ "rope_scaling": null)
//                5.x: "rope_parameters": {"rope_type": "default", "rope_theta": θ}
//                Both present and different: refused, naming both values.
//   dtype        4.x: "torch_dtype"; 5.x: "dtype" (both different: refused).
//   head_dim     written by 5.x (and late 4.x); must be hidden / heads.
//   layer_types  5.x, for models that mix attention kinds; Llama has none.
//   tie_word_embeddings, bos/eos ids: the same defaults in both (Llama untied,
//                GPT-2 tied); loom ignores the token ids and writes them null
//                (a character vocabulary has no special tokens).
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

// The config.json text of cfg as GPT2LMHeadModel or LlamaForCausalLM, with torch_dtype and dtype
// the parameters' dtype ("float32", "bfloat16", "float16").
std::string hf_config_json(const GPTConfig& cfg, DType dtype);

}  // namespace loom::nn
