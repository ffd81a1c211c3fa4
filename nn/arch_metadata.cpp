#include "nn/arch_metadata.h"

#include <iomanip>
#include <type_traits>

namespace loom::nn {

std::map<std::string, std::string> arch_metadata(const GPTConfig& c) {
  const GPTConfig gpt2;
  if (c.rmsnorm == gpt2.rmsnorm && c.norm_eps == gpt2.norm_eps && c.rope == gpt2.rope && c.swiglu == gpt2.swiglu &&
      c.mlp_hidden == gpt2.mlp_hidden && c.n_kv_head == gpt2.n_kv_head && c.tied_embeddings == gpt2.tied_embeddings &&
      c.bias == gpt2.bias)
    return {};
  auto num = [](double v) { return str(std::setprecision(17), v); };
  std::map<std::string, std::string> meta = {{"arch", c.arch()},          {"rmsnorm", std::to_string(c.rmsnorm)},
          {"norm_eps", num(c.norm_eps)}, {"rope", std::to_string(c.rope)},
          {"rope_base", num(c.rope_base)}, {"swiglu", std::to_string(c.swiglu)},
          {"mlp_hidden", std::to_string(c.mlp_hidden)}, {"n_kv_head", std::to_string(c.n_kv_head)},
          {"tied_embeddings", std::to_string(c.tied_embeddings)}, {"bias", std::to_string(c.bias)}};
  if (c.moe.experts > 0) {  // the experts' shape (their routing options are the run's flags)
    meta["experts"] = std::to_string(c.moe.experts);
    meta["experts_per_token"] = std::to_string(c.moe.experts_per_token);
    meta["shared_experts"] = std::to_string(c.moe.shared_experts);
  }
  return meta;
}

void read_arch_metadata(GPTConfig& c, const std::map<std::string, std::string>& meta) {
  auto get = [&](const char* key, auto& field) {
    auto it = meta.find(key);
    if (it == meta.end()) return;
    try {
      size_t used = 0;
      const double v = std::stod(it->second, &used);
      LOOM_CHECK(used == it->second.size(), "trailing characters");
      field = static_cast<std::remove_reference_t<decltype(field)>>(v);
    } catch (const std::exception&) {
      throw Error(str("GPTConfig: metadata '", key, "' is not a number: '", it->second, "'"));
    }
  };
  get("rmsnorm", c.rmsnorm);
  get("norm_eps", c.norm_eps);
  get("rope", c.rope);
  get("rope_base", c.rope_base);
  get("swiglu", c.swiglu);
  get("mlp_hidden", c.mlp_hidden);
  get("n_kv_head", c.n_kv_head);
  get("tied_embeddings", c.tied_embeddings);
  get("bias", c.bias);
  get("experts", c.moe.experts);
  get("experts_per_token", c.moe.experts_per_token);
  get("shared_experts", c.moe.shared_experts);
}

}  // namespace loom::nn
