// train_gpt's checks of the mixture-of-experts flags (examples/train_args_moe.cpp),
// before any work. What has not been made equal to one process yet is refused,
// naming the flags: the experts train in one process or under data parallel
// (--dp, naive or bucketed, ZeRO-1/2, and --ep: tests/test_train_gpt_expert_parallel.cpp);
// tp, pp, cp, ZeRO-3 and recomputation with experts come later.
#include "examples/train_args.h"

namespace loom::train {

void check_moe_flags(const Args& a) {
  if (a.experts == 0) {
    const std::pair<const char*, bool> needs_experts[] = {{"--shared-experts", a.shared_experts > 0},
                                                          {"--capacity-factor", a.capacity_factor > 0},
                                                          {"--router-aux-loss-coef", a.router_aux_loss_coef > 0},
                                                          {"--router-z-loss-coef", a.router_z_loss_coef > 0},
                                                          {"--router-bias-update-rate", a.router_bias_update_rate > 0},
                                                          {"--ep", a.ep > 1}};
    for (const auto& [flag, given] : needs_experts)
      LOOM_CHECK(!given, flag, " tunes a mixture of experts; it needs --experts E (with --arch llama)");
    LOOM_CHECK(a.teach_break != "moe-aux-unscaled", "--teach-break moe-aux-unscaled breaks the scaling of the "
               "router's aux losses; it needs --experts E");
    return;
  }
  LOOM_CHECK(a.teach_break != "moe-aux-unscaled" ||
                 (a.grad_accum > 1 && (a.router_aux_loss_coef > 0 || a.router_z_loss_coef > 0)),
             "--teach-break moe-aux-unscaled leaves the aux losses undivided by the micro-batch count; it shows with "
             "--grad-accum 2 or more and --router-aux-loss-coef (or --router-z-loss-coef) > 0 (got --grad-accum ",
             a.grad_accum, " --router-aux-loss-coef ", a.router_aux_loss_coef, ")");
  LOOM_CHECK(a.arch == "llama", "--experts ", a.experts, " with --arch ", a.arch,
             ": the experts are SwiGLU MLPs without biases (Mixtral's); use --arch llama");
  LOOM_CHECK(a.experts_per_token <= a.experts, "--experts-per-token ", a.experts_per_token, " is more than --experts ",
             a.experts, ": each token goes to k different experts");
  LOOM_CHECK(a.export_hf.empty() || a.shared_experts == 0, "--export-hf with --shared-experts ", a.shared_experts,
             ": transformers' MixtralForCausalLM has no shared experts, so no Hugging Face class loom writes reads "
             "this model; drop --shared-experts or --export-hf");
  LOOM_CHECK(a.export_hf.empty() || a.router_bias_update_rate == 0, "--export-hf with --router-bias-update-rate ",
             a.router_bias_update_rate, ": transformers' MixtralForCausalLM routes without a bias, so the exported "
             "model would choose other experts than the trained one; drop --router-bias-update-rate or --export-hf");
  const std::pair<std::string, bool> not_yet[] = {{str("--tp ", a.tp), a.tp > 1},
                                                  {str("--pp ", a.pp), a.pp > 1},
                                                  {str("--cp ", a.cp), a.cp > 1},
                                                  {str("--zero ", a.zero), a.zero == 3},
                                                  {"--recompute " + a.recompute, a.recompute != "none"},
                                                  {"--device " + a.device, a.device != "cpu"}};
  for (const auto& [flag, given] : not_yet)
    LOOM_CHECK(!given, "--experts ", a.experts, " with ", flag,
               ": a mixture of experts trains on the CPU under data parallel and ZeRO-1/2 only for now (not yet tested "
               "equal to one process under tp, pp, cp, ZeRO-3 or recomputation, nor on a GPU); drop ", flag);
  LOOM_CHECK(!a.memory_report || (a.shared_experts == 0 && a.capacity_factor == 0), "--memory-report with ",
             a.shared_experts > 0 ? str("--shared-experts ", a.shared_experts) : str("--capacity-factor ",
             a.capacity_factor), ": the activation formula counts dropless routed experts only "
             "(optim/moe_activations.h); drop the flag or --memory-report");
  LOOM_CHECK(!a.memory_report || a.dp == 1, "--memory-report with --experts ", a.experts, " and --dp ", a.dp,
             ": the experts' formula is measured on one process only (tests/test_memory_ledger_moe.cpp); "
             "drop --dp or --memory-report");
  // --ep N: N consecutive dp ranks share the experts' compute, E / N experts each (Megatron's layout).
  LOOM_CHECK(a.experts % a.ep == 0, "--ep ", a.ep, " does not divide --experts ", a.experts,
             ": each ep rank computes experts / ep of them");
  LOOM_CHECK(a.dp % a.ep == 0, "--ep ", a.ep, " does not divide --dp ", a.dp,
             ": the ep group is ep consecutive data-parallel ranks (Megatron's layout), so dp must be a multiple of ep");
}

}  // namespace loom::train
