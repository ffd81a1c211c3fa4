#include "nn/hf_mixtral.h"

namespace loom::nn {

using Json = nlohmann::ordered_json;

void read_mixtral_experts(const Json& c, const std::string& path, GPTConfig& cfg) {
  auto integer = [&](const char* key, int64_t fallback) {
    if (!c.contains(key) || c[key].is_null()) return fallback;
    LOOM_CHECK(c[key].is_number_integer(), "read_hf_config: ", path, ": \"", key, "\" has the wrong type: ",
               c[key].dump(), ", not an integer");
    return c[key].get<int64_t>();
  };
  cfg.moe.experts = integer("num_local_experts", 8);  // MixtralConfig's defaults: 8 experts, 2 per token
  cfg.moe.experts_per_token = integer("num_experts_per_tok", 2);
  LOOM_CHECK(cfg.moe.experts >= 1 && 1 <= cfg.moe.experts_per_token && cfg.moe.experts_per_token <= cfg.moe.experts,
             "read_hf_config: ", path, ": \"num_experts_per_tok\": ", cfg.moe.experts_per_token,
             " must be in [1, num_local_experts = ", cfg.moe.experts, "]");
  const bool jitter = c.contains("router_jitter_noise") && !c["router_jitter_noise"].is_null() &&
                      !(c["router_jitter_noise"].is_number() && c["router_jitter_noise"].get<double>() == 0.0);
  LOOM_CHECK(!jitter, "read_hf_config: ", path, ": \"router_jitter_noise\": ", c["router_jitter_noise"].dump(),
             " is not loom's Mixtral, which has 0 (no noise on the router's input)");
  const bool window = c.contains("sliding_window") && !c["sliding_window"].is_null();
  LOOM_CHECK(!window, "read_hf_config: ", path, ": \"sliding_window\": ", window ? c["sliding_window"].dump() : "",
             " is not loom's Mixtral, which has null (attention over the whole block)");
}

void write_mixtral_experts(const GPTConfig& cfg, Json& c) {
  c["num_local_experts"] = cfg.moe.experts;
  c["num_experts_per_tok"] = cfg.moe.experts_per_token;
  c["router_aux_loss_coef"] = cfg.moe.aux_loss_coef;  // read by transformers only with output_router_logits
  c["output_router_logits"] = false;
  c["router_jitter_noise"] = 0.0;
  c["sliding_window"] = nullptr;
}

void append_mixtral_names(const GPTConfig& cfg, const std::string& l, const std::string& h, std::vector<HfName>& t) {
  const int64_t C = cfg.n_embd, I = cfg.ffn_hidden(), E = cfg.moe.experts;
  t.push_back({l + "moe.gate.weight", h + "block_sparse_moe.gate.weight", {E, C}});
  for (int64_t m = 0; m < E; ++m) {
    const std::string le = str(l, "moe.experts.", m, "."), he = str(h, "block_sparse_moe.experts.", m, ".");
    t.push_back({le + "w1.weight", he + "w1.weight", {I, C}});
    t.push_back({le + "w2.weight", he + "w2.weight", {C, I}});
    t.push_back({le + "w3.weight", he + "w3.weight", {I, C}});
  }
}

}  // namespace loom::nn
