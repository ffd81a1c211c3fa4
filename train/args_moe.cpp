// train_gpt's mixture-of-experts flags (nn/moe.h; docs/19-mixture-of-experts.md).
// What they may be combined with is checked in train/checks.cpp.
#include <CLI/CLI.hpp>

#include "train/args.h"
#include "tensor/numbers.h"

namespace loom::train {

namespace {

template <class T>
void number(CLI::App& app, const std::string& flag, T& field, const NumberRange<T>& range, const std::string& help) {
  auto read = [&field, flag, range](const CLI::results_t& given) {
    try {
      field = parse_number<T>(given.back(), flag, range);
    } catch (const Error& e) {
      throw CLI::ValidationError(e.what(), 1);
    }
    return true;
  };
  app.add_option(flag, CLI::callback_t(read), help)->default_str(str(field));
}

}  // namespace

void add_moe_options(CLI::App& app, Args& a) {
  number(app, "--experts", a.experts, {0, 4096, " (0: a dense MLP)"},
         "--arch llama: a mixture of this many SwiGLU experts (width --mlp-hidden) in each block's MLP place "
         "(Mixtral's sparse MoE; 0: the dense MLP)");
  number(app, "--experts-per-token", a.experts_per_token, {1, 4096}, "--experts: the k experts each token is sent to");
  number(app, "--shared-experts", a.shared_experts, {0, 4096},
         "--experts: always-on experts every token also passes through (DeepSeek/Qwen style)");
  number(app, "--capacity-factor", a.capacity_factor, {0.0, 1e6, " (0: dropless)"},
         "--experts: each expert takes at most ceil(F tokens k / experts) tokens per micro-batch, the overflow is "
         "dropped (Switch); 0: dropless");
  number(app, "--router-aux-loss-coef", a.router_aux_loss_coef, {0.0, 1e6},
         "--experts: weight of the load-balancing loss E sum_e f_e P_e of each layer (Switch/Mixtral)");
  number(app, "--router-z-loss-coef", a.router_z_loss_coef, {0.0, 1e6},
         "--experts: weight of the router z-loss mean(logsumexp(logits)^2) (ST-MoE)");
  number(app, "--router-bias-update-rate", a.router_bias_update_rate, {0.0, 1e6},
         "--experts: DeepSeek-V3's aux-loss-free balancing: a per-expert bias on the routing scores, moved by this "
         "much toward the mean load after each step (0: off)");
  number(app, "--ep", a.ep, {1, 4096},
         "--experts: expert parallelism, the experts split over this many consecutive --dp ranks; tokens reach "
         "them by all-to-all (dispatch) and come back by another (combine)");
}

void apply_moe_flags(nn::GPTConfig& cfg, const Args& a, const std::string& source) {
  if (source.empty()) {  // a new model: its experts are the flags'
    cfg.moe.experts = a.experts;
    cfg.moe.experts_per_token = a.experts_per_token;
    cfg.moe.shared_experts = a.shared_experts;
  } else {
    LOOM_CHECK(a.experts == 0 || a.experts == cfg.moe.experts, "--experts ", a.experts, ", but ", source, " has ",
               cfg.moe.experts, " experts per block; drop --experts");
    LOOM_CHECK(a.experts == 0 || a.experts_per_token == cfg.moe.experts_per_token, "--experts-per-token ",
               a.experts_per_token, ", but ", source, " routes each token to ", cfg.moe.experts_per_token,
               " experts; drop --experts-per-token");
    if (cfg.moe.experts > 0) {  // the model's experts, though no --experts was given: what they refuse, still refused
      Args b = a;
      b.arch = "llama", b.experts = cfg.moe.experts, b.experts_per_token = cfg.moe.experts_per_token;
      b.shared_experts = cfg.moe.shared_experts;
      try {
        check_moe_flags(b);
      } catch (const Error& e) {
        throw Error(str(source, " has ", cfg.moe.experts, " experts per block: ", e.what()));
      }
    }
  }
  cfg.moe.capacity_factor = a.capacity_factor;
  cfg.moe.aux_loss_coef = a.router_aux_loss_coef;
  cfg.moe.z_loss_coef = a.router_z_loss_coef;
  cfg.moe.bias_update_rate = a.router_bias_update_rate;
}

}  // namespace loom::train
