// train_gpt's checks of the mixture-of-experts flags (examples/train_args_moe.cpp),
// before any work. What has not been made equal to one process yet is refused,
// naming the flags: the experts train in one process or under data parallel
// (--dp, naive or bucketed, ZeRO-1/2: tests/test_train_gpt_expert_parallel.cpp);
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
    return;
  }
  LOOM_CHECK(a.arch == "llama", "--experts ", a.experts, " with --arch ", a.arch,
             ": the experts are SwiGLU MLPs without biases (Mixtral's); use --arch llama");
  LOOM_CHECK(a.experts_per_token <= a.experts, "--experts-per-token ", a.experts_per_token, " is more than --experts ",
             a.experts, ": each token goes to k different experts");
  LOOM_CHECK(a.export_hf.empty() || a.shared_experts == 0, "--export-hf with --shared-experts ", a.shared_experts,
             ": transformers' MixtralForCausalLM has no shared experts, so no Hugging Face class loom writes reads "
             "this model; drop --shared-experts or --export-hf");
  const std::pair<std::string, bool> not_yet[] = {{str("--tp ", a.tp), a.tp > 1},
                                                  {str("--pp ", a.pp), a.pp > 1},
                                                  {str("--cp ", a.cp), a.cp > 1},
                                                  {str("--zero ", a.zero), a.zero == 3},
                                                  {"--recompute " + a.recompute, a.recompute != "none"},
                                                  {"--memory-report", a.memory_report},
                                                  {"--device " + a.device, a.device != "cpu"}};
  for (const auto& [flag, given] : not_yet)
    LOOM_CHECK(!given, "--experts ", a.experts, " with ", flag,
               ": a mixture of experts trains on the CPU under data parallel and ZeRO-1/2 only for now (not yet tested "
               "equal to one process under tp, pp, cp, ZeRO-3 or recomputation, nor on a GPU; --memory-report has no "
               "formula for the experts yet); drop ", flag);
  // --ep N: N consecutive dp ranks share the experts' compute, E / N experts each (Megatron's layout).
  LOOM_CHECK(a.experts % a.ep == 0, "--ep ", a.ep, " does not divide --experts ", a.experts,
             ": each ep rank computes experts / ep of them");
  LOOM_CHECK(a.dp % a.ep == 0, "--ep ", a.ep, " does not divide --dp ", a.dp,
             ": the ep group is ep consecutive data-parallel ranks (Megatron's layout), so dp must be a multiple of ep");
  LOOM_CHECK(a.router_bias_update_rate == 0 || a.resume.empty(), "--router-bias-update-rate ",
             a.router_bias_update_rate, " with --resume ", a.resume,
             ": the routing biases are not in the checkpoint yet, so a resumed run would restart them at 0; "
             "drop --router-bias-update-rate or --resume");
}

}  // namespace loom::train
