// train_gpt's checks of the mixture-of-experts flags (train/args_moe.cpp),
// before any work. What has not been made equal to one process yet is refused,
// naming the flags: the experts train in one process, under data parallel
// (--dp, naive or bucketed, ZeRO-1/2/3, --ep included: tests/test_train_gpt_expert_parallel.cpp,
// tests/test_train_gpt_expert_zero.cpp),
// pipeline parallel (every schedule) and recomputation
// (tests/test_train_gpt_moe_pipeline.cpp), under tp (with or without sequence
// parallelism) and cp (tests/test_train_gpt_moe_tensor_parallel.cpp),
// and under tp or cp together with pp, ZeRO-3 or recomputation
// (tests/test_train_gpt_moe_combined.cpp). --ep (each rank holding E / ep
// experts) trains under dp, ZeRO-1/2/3, cp, recomputation, and tp or pp
// (tests/test_train_gpt_expert_grid.cpp), tp with ZeRO-1/2/3
// (tests/test_train_gpt_expert_tp_zero.cpp), ZeRO-3 with hybrid sharding
// (tests/test_train_gpt_expert_hsdp.cpp), tp and pp together, and pp with
// ZeRO-3 (tests/test_train_gpt_expert_pipeline_grid.cpp). On a GPU: one
// process, --dp and --ep (tests/cuda/test_cuda_train_gpt_moe.cpp, test_cuda_train_gpt_parallel.cpp).
#include "parallel/pipeline_parallel/partition.h"
#include "train/args.h"

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
  // On a GPU the experts train in one process (tests/cuda/test_cuda_train_gpt_moe.cpp: the routing on the host,
  // index_add's sorted segments for permute's backward) and under --dp and --ep with ZeRO-1 at most, over
  // --backend mpi on one GPU or NCCL's grouped send/recv on two (tests/cuda/test_cuda_train_gpt_parallel.cpp).
  // The other axes and ZeRO-2/3 with experts are tested on the CPU only, and so is the memory formula
  // (index_add's sort allocates on a GPU what the CPU's loop does not).
  const std::pair<std::string, bool> cpu_only[] = {{str("--tp ", a.tp), a.tp > 1},     {str("--pp ", a.pp), a.pp > 1},
                                                   {str("--cp ", a.cp), a.cp > 1},     {str("--zero ", a.zero), a.zero > 1},
                                                   {"--memory-report", a.memory_report}};
  for (const auto& [flag, given] : cpu_only)
    LOOM_CHECK(a.device == "cpu" || !given, "--experts ", a.experts, " with --device ", a.device, " and ", flag,
               ": on a GPU a mixture of experts trains in one process or under --dp and --ep (ZeRO-1 at most), "
               "without --memory-report, for now (the other axes and the memory formula are tested with experts on "
               "the CPU only); drop ", flag, " or --device");
  // Sequence and context parallelism split each micro-batch's tokens over ranks (parallel/moe_token_shards.h):
  // which slot an expert drops depends on every token's place in the micro-batch.
  const bool split_tokens = (a.tp > 1 && a.sequence_parallel) || a.cp > 1;
  LOOM_CHECK(!split_tokens || a.capacity_factor == 0, "--capacity-factor ", a.capacity_factor, " with ",
             a.cp > 1 ? str("--cp ", a.cp) : str("--tp ", a.tp, " --sequence-parallel"),
             ": the micro-batch's tokens are split over ranks, and which ones an expert drops depends on all of them "
             "in order; drop --capacity-factor (dropless) or ", a.cp > 1 ? "--cp" : "--sequence-parallel");
  // Measured = formula (tests/test_memory_ledger_moe.cpp): one process, --dp (ZeRO 0-2), --ep (ZeRO 0-2:
  // the experts' gradients and optimizer state sharded over their expert-dp group), --tp (with or without
  // sequence parallelism: the router and the experts whole on every tp rank), --pp and --recompute
  // selective and full (the MoE block's forward rerun inside backward; under --ep each block's rerun with
  // the rows its own dispatch received, train/diagnostics_moe.cpp), --shared-experts with each (a
  // dense SwiGLU beside the routed experts, its backward first) and --capacity-factor with each but the
  // ones below (the rows the routing kept, block by block), --ep with --tp under ZeRO-1/2 (the experts'
  // buffers sharded over expert-dp on each tp rank), and ZeRO-3 on one stage (with --ep too: the units it
  // gathers, the unit's .grad tensors and reduce-scatter in flight at each moment, optim/zero3_activations.h;
  // with --recompute full the block before the last reruns beside the last block's reduce-scatter), and
  // --cp, dropless (ring attention's out and lse and its backward's buffers: optim/ring_activations.h), and
  // ZeRO-3 with --pp (each stage's own units; under --ep each micro-batch in flight keeps the rows its own
  // dispatch brought: train/diagnostics_moe.cpp's walk), 1F1B or AFAB, and ZeRO-3 without reshard after
  // forward (every earlier layer's units still gathered at each moment), under --recompute full too (each
  // micro-batch's reruns with the micro-batches in flight at its backward), and interleaved 1F1B (--virtual-stages:
  // predict_activations_interleaved's walk, each chunk's micro-batches with their own rows and, under ZeRO-3, the
  // chunk's own units, optim/zero3_activations.h), and the zero-bubble schedules (zb-h1, zb-v, dualpipev: the
  // experts' linears' X and dY held from B to W, B's experts walked one by one with each micro-batch's own rows,
  // optim/moe_activations.h; with --ep, a capacity, shared experts, --tp and ZeRO-3 too), and interleaved
  // --recompute full with --ep or a capacity (each chunk's blocks rerun with their own rows, the costliest
  // block's: optim/pipeline_activations.cpp; under ZeRO-3 each beside the next block's reduce-scatter). Not yet:
  // that without ZeRO-3's reshard after forward (the earlier blocks' units gathered since their forward: stage 1
  // measured 5-10% below the formula).
  const bool zero_bubble = parallel::schedule_splits_backward(a.schedule);
  const bool routed_rows = a.ep > 1 || a.capacity_factor > 0;
  const std::string rows = a.ep > 1 ? str("--ep ", a.ep) : str("--capacity-factor ", a.capacity_factor);
  LOOM_CHECK(!a.memory_report || a.virtual_stages == 1 || zero_bubble || a.recompute != "full" || !routed_rows ||
                 a.zero < 3 || a.zero3_reshard_after_forward == "on",
             "--memory-report with --experts ", a.experts, ", ", rows, ", --virtual-stages ", a.virtual_stages,
             ", --recompute full, --zero 3 and --zero3-reshard-after-forward off: the formula walks each block's rerun "
             "with its own rows beside the units gathered since their forward through 1F1B and AFAB only; drop "
             "--virtual-stages, ", rows, ", --recompute full, --zero3-reshard-after-forward off or --memory-report");
  // --ep N: N consecutive dp ranks share the experts' compute, E / N experts each (Megatron's layout).
  LOOM_CHECK(a.experts % a.ep == 0, "--ep ", a.ep, " does not divide --experts ", a.experts,
             ": each ep rank computes experts / ep of them");
  LOOM_CHECK(a.dp % a.ep == 0, "--ep ", a.ep, " does not divide --dp ", a.dp,
             ": the ep group is ep consecutive data-parallel ranks (Megatron's layout), so dp must be a multiple of ep");
  // HSDP: the ep group lies inside one shard group (torchtitan's dp_shard_in_ep), whose ranks holding the same
  // experts shard them; the replicas hold copies, as of every shard (parallel/process_group_manager.h).
  LOOM_CHECK(a.ep == 1 || a.dp_shard == 0 || a.dp_shard % a.ep == 0, "--ep ", a.ep, " with --dp-shard ", a.dp_shard,
             ": the ep group is ep consecutive ranks of one shard group (the experts are split inside it and sharded "
             "over its ranks that hold the same ones), so --ep must divide --dp-shard");
  // Each ep rank holds only its E / ep experts (parallel/expert_parallel/expert_parallel.h), tested equal to one
  // process under dp, ZeRO-1/2/3 (sharded over their expert-dp group: tests/test_train_gpt_expert_zero.cpp;
  // HSDP: tests/test_train_gpt_expert_hsdp.cpp), cp, recomputation, tp (+SP) or pp
  // (tests/test_train_gpt_expert_grid.cpp), tp (+SP) with ZeRO-1/2/3 (tests/test_train_gpt_expert_tp_zero.cpp),
  // tp and pp together, and pp with ZeRO-3 (tests/test_train_gpt_expert_pipeline_grid.cpp): nothing left to refuse.
}

}  // namespace loom::train
