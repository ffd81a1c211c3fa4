// config.json <-> GPTConfig (format notes in hf_config.h). The keys and
// defaults are transformers' GPT2Config and LlamaConfig; a key loom cannot honour is refused
// rather than ignored, so a loaded model is the model the folder describes.
#include "nn/hf_config.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/hf_mixtral.h"
#include "nn/json_file.h"

namespace loom::nn {

using Json = nlohmann::ordered_json;

namespace {

// config[key] as T; `fallback` when absent (transformers' default), an error when absent without one.
template <class T>
T get(const Json& config, const std::string& key, const std::string& path, const T* fallback = nullptr) {
  if (!config.contains(key) || config[key].is_null()) {
    LOOM_CHECK(fallback, "read_hf_config: ", path, ": the key \"", key, "\" is missing");
    return *fallback;
  }
  // An integer key must hold an integer: nlohmann converts a float (1e209) with a cast whose overflow is
  // undefined behaviour (found by fuzz_hf_config's sibling, fuzz_tokenizer).
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
    LOOM_CHECK(config[key].is_number_integer(), "read_hf_config: ", path, ": \"", key,
               "\" has the wrong type: ", config[key].dump(), ", not an integer");
  try {
    return config[key].get<T>();
  } catch (const Json::exception&) {
    throw Error(str("read_hf_config: ", path, ": \"", key, "\" has the wrong type: ", config[key].dump()));
  }
}

// The parameters' dtype: transformers 4.x writes "torch_dtype", 5.x "dtype" (and reads either). loom
// converts every tensor to fp32 whatever it says, but two that disagree describe two models: refused.
void check_dtype_keys(const Json& c, const std::string& path) {
  const bool both = c.contains("torch_dtype") && !c["torch_dtype"].is_null() && c.contains("dtype") &&
                    !c["dtype"].is_null();
  LOOM_CHECK(!both || c["torch_dtype"] == c["dtype"], "read_hf_config: ", path, ": \"torch_dtype\": ",
             c.contains("torch_dtype") ? c["torch_dtype"].dump() : "", " and \"dtype\": ",
             c.contains("dtype") ? c["dtype"].dump() : "",
             " disagree (transformers 4.x reads the first, 5.x the second)");
}

GPTConfig read_gpt2(const Json& c, const std::string& path) {
  auto refuse_unless = [&](bool ok, const std::string& key, const std::string& loom_has) {
    LOOM_CHECK(ok, "read_hf_config: ", path, ": \"", key, "\": ", c.contains(key) ? c[key].dump() : "(absent)",
               " is not loom's GPT-2, which has ", loom_has);
  };
  if (c.contains("architectures") && !c["architectures"].is_null())
    for (const Json& arch : c["architectures"])
      refuse_unless(arch == "GPT2LMHeadModel" || arch == "GPT2Model", "architectures",
                    "GPT2LMHeadModel (a GPT-2 language model)");
  const double p01 = 0.1, eps_default = 1e-5;
  const bool yes = true, no = false;
  const std::string gelu_new = "gelu_new";
  const std::string act = get(c, "activation_function", path, &gelu_new);
  refuse_unless(act == "gelu_new" || act == "gelu_pytorch_tanh", "activation_function", "gelu_new (tanh GELU)");
  refuse_unless(std::abs(get(c, "layer_norm_epsilon", path, &eps_default) - 1e-5) <= 1e-12, "layer_norm_epsilon",
                "1e-05");
  refuse_unless(get(c, "scale_attn_weights", path, &yes), "scale_attn_weights", "true (scores / sqrt(head dim))");
  refuse_unless(!get(c, "scale_attn_by_inverse_layer_idx", path, &no), "scale_attn_by_inverse_layer_idx", "false");
  refuse_unless(!get(c, "add_cross_attention", path, &no), "add_cross_attention", "false");
  refuse_unless(get(c, "tie_word_embeddings", path, &yes), "tie_word_embeddings", "true (lm_head is wte)");
  check_dtype_keys(c, path);

  GPTConfig cfg;
  cfg.vocab_size = get<int64_t>(c, "vocab_size", path);
  cfg.block_size = get<int64_t>(c, "n_positions", path);
  cfg.n_layer = get<int64_t>(c, "n_layer", path);
  cfg.n_head = get<int64_t>(c, "n_head", path);
  cfg.n_embd = get<int64_t>(c, "n_embd", path);
  const int64_t four_c = 4 * cfg.n_embd;
  refuse_unless(get(c, "n_inner", path, &four_c) == four_c, "n_inner", str("null or 4 n_embd = ", four_c));
  // One dropout probability in loom: the three of GPT-2 must agree.
  const double resid = get(c, "resid_pdrop", path, &p01), embd = get(c, "embd_pdrop", path, &p01),
               attn = get(c, "attn_pdrop", path, &p01);
  LOOM_CHECK(resid == embd && embd == attn, "read_hf_config: ", path, ": resid_pdrop ", resid, ", embd_pdrop ", embd,
             ", attn_pdrop ", attn, " differ; loom's GPT has one dropout probability for all three");
  cfg.dropout = resid;
  try {
    cfg.validate();
  } catch (const Error& e) {
    throw Error(str("read_hf_config: ", path, ": ", e.what()));
  }
  return cfg;
}

// RoPE's base θ. transformers 4.x writes a top-level "rope_theta" and "rope_scaling" (null, or a
// scaled RoPE); 5.x writes "rope_parameters": {"rope_theta": θ, "rope_type": "default"} and no
// top-level rope_theta (and reads "rope_scaling" in place of "rope_parameters" when both are there).
// Every θ present must be the same number, and every RoPE dict's type "default" (the plain RoPE
// loom computes): a scaled one (linear, dynamic, yarn, llama3, longrope) is refused by name.
// None: the config class's default (LlamaConfig's 10000, MixtralConfig's 1000000).
double read_rope_theta(const Json& c, const std::string& path, double default_theta) {
  std::vector<std::pair<std::string, double>> thetas;  // "key": θ, for each place θ was given
  auto add_theta = [&](const Json& holder, const std::string& key, const std::string& name) {
    if (!holder.contains(key) || holder[key].is_null()) return;
    LOOM_CHECK(holder[key].is_number(), "read_hf_config: ", path, ": \"", name, "\" has the wrong type: ",
               holder[key].dump());
    thetas.emplace_back(name, holder[key].get<double>());
  };
  add_theta(c, "rope_theta", "rope_theta");
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!c.contains(key) || c[key].is_null()) continue;
    const Json& rope = c[key];
    LOOM_CHECK(rope.is_object(), "read_hf_config: ", path, ": \"", key, "\": ", rope.dump(),
               " is not a JSON object (transformers writes {\"rope_type\": ..., \"rope_theta\": ...})");
    const Json type = rope.contains("rope_type") ? rope["rope_type"]  // 4.x wrote "type"
                      : rope.contains("type")    ? rope["type"]
                                                 : Json("default");
    LOOM_CHECK(type == "default", "read_hf_config: ", path, ": \"", key, "\": ", rope.dump(), ": rope_type ",
               type.dump(), " is not loom's Llama, which has \"default\" (plain RoPE; loom implements no "
               "position scaling: linear, dynamic, yarn, llama3, longrope)");
    add_theta(rope, "rope_theta", str(key, ".rope_theta"));
  }
  for (const auto& [key, theta] : thetas)
    LOOM_CHECK(theta == thetas.front().second, "read_hf_config: ", path, ": \"", thetas.front().first, "\": ",
               Json(thetas.front().second).dump(), " and \"", key, "\": ", Json(theta).dump(),
               " disagree (transformers 4.x reads the top-level rope_theta, 5.x the one in rope_parameters or "
               "rope_scaling): refusing to guess the model's RoPE base");
  return thetas.empty() ? default_theta : thetas.front().second;
}

// LlamaForCausalLM's config (transformers' LlamaConfig and its defaults), or the
// Llama part of MixtralForCausalLM's (MixtralConfig's defaults: hf_mixtral.h).
GPTConfig read_llama(const Json& c, const std::string& path, const LlamaFamilyDefaults& d = kLlamaDefaults) {
  auto refuse_unless = [&](bool ok, const std::string& key, const std::string& loom_has) {
    LOOM_CHECK(ok, "read_hf_config: ", path, ": \"", key, "\": ", c.contains(key) ? c[key].dump() : "(absent)",
               " is not loom's Llama, which has ", loom_has);
  };
  if (c.contains("architectures") && !c["architectures"].is_null())
    for (const Json& arch : c["architectures"])
      refuse_unless(arch == d.architecture, "architectures", str(d.architecture, " (a ", d.model_type,
                                                                  " language model)"));
  const std::string silu = "silu";
  const bool no = false;
  const double zero = 0.0, eps_default = d.rms_norm_eps;
  refuse_unless(get(c, "hidden_act", path, &silu) == "silu", "hidden_act", "silu (SwiGLU's gate)");
  refuse_unless(!get(c, "attention_bias", path, &no), "attention_bias", "false (no biases)");
  refuse_unless(!get(c, "mlp_bias", path, &no), "mlp_bias", "false (no biases)");
  refuse_unless(get(c, "attention_dropout", path, &zero) == 0.0, "attention_dropout", "0 (no dropout)");

  GPTConfig cfg;
  cfg.set_arch("llama");
  cfg.vocab_size = get<int64_t>(c, "vocab_size", path);
  cfg.block_size = get<int64_t>(c, "max_position_embeddings", path);
  cfg.n_layer = get<int64_t>(c, "num_hidden_layers", path);
  cfg.n_head = get<int64_t>(c, "num_attention_heads", path);
  cfg.n_embd = get<int64_t>(c, "hidden_size", path);
  cfg.n_kv_head = get(c, "num_key_value_heads", path, &cfg.n_head);
  cfg.mlp_hidden = get<int64_t>(c, "intermediate_size", path);
  cfg.norm_eps = get(c, "rms_norm_eps", path, &eps_default);
  cfg.rope_base = read_rope_theta(c, path, d.rope_theta);
  cfg.tied_embeddings = get(c, "tie_word_embeddings", path, &no);  // LlamaConfig's default, in 4.x and 5.x
  check_dtype_keys(c, path);
  if (c.contains("layer_types") && !c["layer_types"].is_null()) {  // 5.x's per-layer attention kind
    bool all_full = c["layer_types"].is_array() && int64_t(c["layer_types"].size()) == cfg.n_layer;
    for (const Json& t : c["layer_types"]) all_full = all_full && t == "full_attention";
    refuse_unless(all_full, "layer_types", str(cfg.n_layer, " x \"full_attention\" (causal attention over the "
                                               "whole block in every layer, no sliding window)"));
  }
  cfg.dropout = 0.0;
  if (d.model_type == std::string("mixtral")) read_mixtral_experts(c, path, cfg);
  if (cfg.n_head > 0) {
    const int64_t hd = cfg.n_embd / cfg.n_head;
    refuse_unless(get(c, "head_dim", path, &hd) == hd && cfg.n_embd % cfg.n_head == 0, "head_dim",
                  str("hidden_size / num_attention_heads = ", cfg.n_embd, " / ", cfg.n_head));
  }
  try {
    cfg.validate();
  } catch (const Error& e) {
    throw Error(str("read_hf_config: ", path, ": ", e.what()));
  }
  return cfg;
}

}  // namespace

std::string hf_family(const GPTConfig& cfg) {
  if (cfg.arch() == "gpt2") return "gpt2";
  const bool llama_blocks = cfg.rmsnorm && cfg.rope && cfg.swiglu && !cfg.bias;
  if (llama_blocks && cfg.moe.experts > 0) {
    LOOM_CHECK(cfg.moe.shared_experts == 0, "Hugging Face format: MixtralForCausalLM has no shared experts, and this "
               "model has ", cfg.moe.shared_experts, " (--shared-experts): no transformers class loom writes reads it");
    return "mixtral";
  }
  if (llama_blocks) return "llama";
  throw Error(str("Hugging Face format: loom's ", cfg.arch(), " mix (rmsnorm ", cfg.rmsnorm, ", rope ", cfg.rope,
                  ", swiglu ", cfg.swiglu, ", bias ", cfg.bias, ", tied ", cfg.tied_embeddings,
                  ") is neither GPT-2's nor Llama's blocks, so no transformers class reads it"));
}

GPTConfig read_hf_config(const std::string& path) {
  const Json c = read_json_file(path, "read_hf_config");
  LOOM_CHECK(c.is_object(), "read_hf_config: ", path, ": expected a JSON object, got ", c.type_name());
  const std::string model_type = get<std::string>(c, "model_type", path);
  try {
    if (model_type == "gpt2") return read_gpt2(c, path);
    if (model_type == "llama") return read_llama(c, path);
    if (model_type == "mixtral") return read_llama(c, path, kMixtralDefaults);
  } catch (const nlohmann::json::exception& e) {  // a stranger's file: a key of another type than get<> checks
    throw Error(str("read_hf_config: ", path, ": not a config.json loom reads: ", e.what()));
  }
  throw Error(str("read_hf_config: ", path, ": model_type \"", model_type,
                  "\" is not an architecture loom reads (it reads: gpt2, llama, mixtral)"));
}

std::string hf_config_json(const GPTConfig& cfg, DType dtype) {
  const char* torch_dtype = dtype == kBFloat16 ? "bfloat16" : dtype == kFloat16 ? "float16" : "float32";
  Json c;
  const std::string family = hf_family(cfg);
  if (family == "llama" || family == "mixtral") {
    c["architectures"] = {family == "llama" ? "LlamaForCausalLM" : "MixtralForCausalLM"};
    c["model_type"] = family;
    c["vocab_size"] = cfg.vocab_size;
    c["max_position_embeddings"] = cfg.block_size;
    c["hidden_size"] = cfg.n_embd;
    c["intermediate_size"] = cfg.ffn_hidden();
    c["num_hidden_layers"] = cfg.n_layer;
    c["num_attention_heads"] = cfg.n_head;
    c["num_key_value_heads"] = cfg.kv_heads();
    c["hidden_act"] = "silu";
    c["rms_norm_eps"] = cfg.norm_eps;
    c["head_dim"] = cfg.n_embd / cfg.n_head;
    c["rope_theta"] = cfg.rope_base;  // 4.x's place for θ, and 5.x's below: both read the same RoPE
    c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", cfg.rope_base}};
    c["rope_scaling"] = nullptr;
    c["attention_bias"] = false;
    c["mlp_bias"] = false;
    c["attention_dropout"] = 0.0;  // loom's --dropout is a training choice; the model HF runs has none
    c["initializer_range"] = 0.02;
    c["tie_word_embeddings"] = cfg.tied_embeddings;
    c["bos_token_id"] = nullptr;  // loom knows no special tokens; absent, transformers would make them 1 and 2
    c["eos_token_id"] = nullptr;
    c["torch_dtype"] = torch_dtype;  // 4.x's name, and 5.x's:
    c["dtype"] = torch_dtype;
    if (family == "mixtral") write_mixtral_experts(cfg, c);
    return c.dump(2) + "\n";
  }
  c["architectures"] = {"GPT2LMHeadModel"};
  c["model_type"] = "gpt2";
  c["vocab_size"] = cfg.vocab_size;
  c["n_positions"] = cfg.block_size;
  c["n_embd"] = cfg.n_embd;
  c["n_layer"] = cfg.n_layer;
  c["n_head"] = cfg.n_head;
  c["n_inner"] = nullptr;  // 4 n_embd
  c["activation_function"] = "gelu_new";
  c["resid_pdrop"] = cfg.dropout;
  c["embd_pdrop"] = cfg.dropout;
  c["attn_pdrop"] = cfg.dropout;
  c["layer_norm_epsilon"] = 1e-5;
  c["initializer_range"] = 0.02;
  c["scale_attn_weights"] = true;
  c["scale_attn_by_inverse_layer_idx"] = false;
  c["reorder_and_upcast_attn"] = false;
  c["tie_word_embeddings"] = true;
  c["bos_token_id"] = nullptr;  // absent, transformers would make them 50256, past a small vocabulary
  c["eos_token_id"] = nullptr;
  c["torch_dtype"] = torch_dtype;
  c["dtype"] = torch_dtype;
  return c.dump(2) + "\n";
}

}  // namespace loom::nn
