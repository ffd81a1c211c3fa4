// loom_plan: predict a training run you cannot afford from the formulas in
// plan/ - per-rank memory, the pipeline bubble, each group's communication,
// the step time, MFU, and which constraint binds.
//
//   build/plan/loom_plan --layers 4 --embd 128 --heads 4 --block 64 --batch 16 --dp 2 --machine cpu
//   build/plan/loom_plan --model gpt3-175b --machine a100 --tp 8 --pp 12 --dp 16 --batch 1
//       --microbatches 96 --dtype bf16 --recompute
//
// The flags are train_gpt's (same names, same meaning: --batch is the
// micro-batch per dp rank), plus the machine and a few knobs train_gpt lacks.
// --model gives a preset shape; a shape flag given as well (--layers 2)
// overrides that one number, and loom_plan says so. --tokens: also the time
// to train on that many tokens, and the device-hours.
// --calibrate-ms: the measured step time of the same model on ONE rank here,
// one micro-batch of --batch sequences per step;
// the efficiency is set so that the one-rank plan matches it, and the grid
// asked for is predicted from there (docs/09-planner.md).
#include <CLI/CLI.hpp>

#include <cstdio>

#include "plan/check_plan.h"
#include "plan/moe_model.h"
#include "plan/report.h"
#include "tensor/error.h"

using namespace loom::plan;

int main(int argc, char** argv) {
  CLI::App app{"loom_plan: predict memory, communication, step time and MFU of a GPT training run"};
  app.option_defaults()->always_capture_default();  // --help shows each default
  ModelShape m;
  Grid g;
  Batch b;
  std::string machine = "cpu", model;
  double efficiency = 0, calibrate_ms = 0, tokens = 0, latency_us = -1, link_gbs = 0, handoff_us = -1, gflops = 0, memory_gib = 0;
  app.add_option("--model", model, "a preset shape: gpt3-175b (96 x 12288, 96 heads, seq 2048, vocab 51200), gpt2-124m "
                 "(12 x 768, 12 heads, seq 1024, vocab 50257), llama2-70b (80 x 8192, 64 heads, 8 kv heads, "
                 "SwiGLU 28672, seq 4096, vocab 32000), mixtral-8x7b (llama2's 32 x 4096 blocks with 8 kv heads, 8 "
                 "experts of width 14336, top-2) or deepseek-v3 (61 x 7168, 128 heads as MLA's count, vocab 129280, "
                 "256 experts of width 2048 top-8 + 1 shared, the first 3 blocks dense 18432); --layers etc. given "
                 "too override it")
      ->check(CLI::IsMember({"gpt3-175b", "gpt2-124m", "llama2-70b", "mixtral-8x7b", "deepseek-v3"}));
  std::string arch = "gpt2";
  app.add_option("--arch", arch, "gpt2, or llama (SwiGLU's 3 matrices, GQA's smaller k and v, untied head, no biases)")
      ->check(CLI::IsMember({"gpt2", "llama"}));
  app.add_option("--kv-heads", m.kv_heads, "key/value heads (0: --heads)");
  app.add_option("--ffn", m.ffn, "MLP width (0: 4h, or 8h/3 for llama)");
  app.add_option("--experts", m.experts, "--arch llama: a mixture of this many SwiGLU experts in each block's MLP "
                 "place (plan/moe_model.h; 0: dense)");
  app.add_option("--experts-per-token", m.experts_per_token, "--experts: the k experts each token is sent to");
  app.add_option("--shared-experts", m.shared_experts, "--experts: always-on experts every token also passes");
  app.add_option("--expert-ffn", m.expert_ffn, "--experts: an expert's width I (0: --ffn)");
  app.add_option("--dense-layers", m.dense_layers, "--experts: the first blocks keep the dense MLP (DeepSeek-V3: 3)");
  app.add_option("--capacity-factor", m.capacity_factor, "--experts: each expert computes at most ceil(F N k / E) "
                 "of a rank's N tokens' rows, the rest dropped (Switch's; 0: dropless)");
  app.add_option("--ep", g.ep, "expert-parallel ranks, out of --dp: the experts split over them");
  app.add_option("--layers", m.layers, "transformer blocks (L)");
  app.add_option("--embd", m.width, "width (h)");
  app.add_option("--heads", m.heads, "attention heads (a)");
  app.add_option("--vocab", m.vocab, "vocabulary size (V)");
  app.add_option("--block", m.seq, "sequence length (s)");
  app.add_option("--batch", b.micro_batch, "sequences per micro-batch per dp rank (b)");
  app.add_option("--microbatches", b.micro_batches, "micro-batches per step (m; --grad-accum without pp; 0: pp)");
  app.add_option("--dp", g.dp, "data-parallel ranks");
  app.add_option("--pp", g.pp, "pipeline stages");
  app.add_option("--tp", g.tp, "tensor-parallel ranks");
  app.add_option("--cp", g.cp, "context-parallel ranks: each sequence's tokens split over cp, attention as a ring");
  app.add_option("--virtual-stages", g.virtual_stages, "model chunks per pipeline rank (interleaved 1F1B)");
  app.add_option("--zero", g.zero, "ZeRO stage: 1 shards the optimizer state over dp, 2 the gradients too, 3 the "
                 "params too (FSDP) (--zero alone: 1)")->expected(0, 1)->default_str("1")->check(CLI::Range(0, 3));
  app.add_option("--dp-shard", g.dp_shard, "--zero 3: shard over groups of this many dp ranks, replicated across "
                 "them (HSDP; default: dp)");
  app.add_flag("--sequence-parallel", g.sequence_parallel, "Megatron's sequence parallelism (with --tp)");
  app.add_flag("--recompute", g.recompute, "full activation recomputation");
  app.add_flag("--recompute-selective", g.recompute_selective,
               "selective recomputation: only the attention core (Megatron's --recompute-activations)");
  app.add_option("--dtype", g.dtype, "params and activations")->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--schedule", g.schedule, "pipeline schedule (zb-v, dualpipev: --virtual-stages 2, a V)")
      ->check(CLI::IsMember({"1f1b", "afab", "zb-h1", "zb-v", "dualpipev"}));
  app.add_option("--partition", g.partition, "layers into stages: train_gpt's uniform / balanced, or Megatron's blocks")
      ->check(CLI::IsMember({"uniform", "balanced", "blocks"}));
  app.add_option("--machine", machine, "h100, h200, a100, laptop (datasheet numbers), or cpu (this machine, measured)")
      ->check(CLI::IsMember(machine_names()));
  app.add_option("--efficiency", efficiency, "fraction of peak a layer's math reaches (default: the machine's)");
  app.add_option("--calibrate-ms", calibrate_ms, "measured one-rank step time of this model here: sets --efficiency");
  app.add_option("--latency-us", latency_us, "per-message latency of every link");
  app.add_option("--handoff-us", handoff_us, "cpu, more ranks than cores: cost of one synchronous collective");
  app.add_option("--link-gbs", link_gbs, "bandwidth of every link, GB/s per direction (bench/plan_check.sh measures it)");
  app.add_option("--gflops", gflops, "cpu: per-core GFLOP/s instead of measuring");
  app.add_option("--memory-gib", memory_gib, "capacity per device in GiB instead of the table's");
  app.add_option("--tokens", tokens, "also print the time and GPU-hours to train on this many tokens (e.g. 300e9)");
  CLI11_PARSE(app, argc, argv);

  try {
    if (!model.empty()) {  // the preset, with every shape flag given as well taking its place
      ModelShape preset = model == "gpt3-175b"    ? ModelShape{96, 12288, 96, 51200, 2048}
                          : model == "llama2-70b" ? ModelShape{80, 8192, 64, 32000, 4096, true, 8, 28672}
                          : model == "mixtral-8x7b" ? mixtral_8x7b()
                          : model == "deepseek-v3"  ? deepseek_v3()
                                                    : ModelShape{12, 768, 12, 50257, 1024};
      const struct {
        const char* flag;
        int64_t ModelShape::*field;
      } shape[] = {{"--layers", &ModelShape::layers}, {"--embd", &ModelShape::width}, {"--heads", &ModelShape::heads},
                   {"--vocab", &ModelShape::vocab}, {"--block", &ModelShape::seq}};
      for (const auto& f : shape)
        if (app.count(f.flag)) {
          std::printf("%s %lld overrides %s's %lld\n", f.flag, (long long)(m.*f.field), model.c_str(),
                      (long long)(preset.*f.field));
          preset.*f.field = m.*f.field;
        }
      const ModelShape given = m;
      m = preset;
      if (app.count("--kv-heads")) m.kv_heads = given.kv_heads;
      if (app.count("--ffn")) m.ffn = given.ffn;
      const struct {
        const char* flag;
        int64_t ModelShape::*field;
      } moe[] = {{"--experts", &ModelShape::experts}, {"--experts-per-token", &ModelShape::experts_per_token},
                 {"--shared-experts", &ModelShape::shared_experts}, {"--expert-ffn", &ModelShape::expert_ffn},
                 {"--dense-layers", &ModelShape::dense_layers}};
      for (const auto& f : moe)
        if (app.count(f.flag)) m.*f.field = given.*f.field;
      if (app.count("--capacity-factor")) m.capacity_factor = given.capacity_factor;
    }
    if (app.count("--arch")) m.llama = arch == "llama";
    if (b.micro_batches == 0) b.micro_batches = g.pp;  // train_gpt's --microbatches 0
    check_plan(m, g, b);
    check_efficiency(efficiency);
    LOOM_CHECK(!(g.recompute && g.recompute_selective), "--recompute (full) and --recompute-selective: choose one");
    LOOM_CHECK(g.dp_shard == 0 || (g.zero == 3 && g.dp_shard >= 1 && g.dp % g.dp_shard == 0), "--dp-shard ",
               g.dp_shard, " shards ZeRO-3 over groups of dp ranks: it needs --zero 3 and a divisor of --dp ", g.dp,
               " (got --zero ", g.zero, ")");
    LOOM_CHECK(calibrate_ms >= 0 && tokens >= 0, "--calibrate-ms and --tokens must be >= 0, got ", calibrate_ms,
               " and ", tokens);
    if (machine == "cpu" && !app.count("--machine"))
      std::fprintf(stderr, "loom_plan: no --machine: measuring this CPU (loom's GEMM at the MLP's shape, a memcpy; "
                           "seconds to minutes) - or give --machine h100, h200, a100 or laptop\n");
    Machine mc = machine == "cpu" ? measure_this_cpu(m, b) : machine_by_name(machine);
    if (gflops > 0) mc.peak_tflops_16 = mc.peak_tflops_32 = gflops / 1e3;
    if (latency_us >= 0) mc.latency_us = mc.inter_latency_us = latency_us;
    if (handoff_us >= 0) mc.handoff_us = handoff_us;
    if (link_gbs > 0) mc.intra_gbs = mc.inter_gbs = link_gbs, mc.link_efficiency = 1;
    if (memory_gib > 0) mc.memory_gib = memory_gib;
    if (efficiency > 0) mc.efficiency = efficiency;
    if (calibrate_ms > 0) {
      // One rank: step = compute / efficiency + optimizer, so efficiency =
      // compute at efficiency 1 / (measured - optimizer).
      Grid one = g;
      one.dp = one.pp = one.tp = one.cp = 1, one.virtual_stages = 1, one.zero = 0, one.sequence_parallel = false;
      Machine ideal = mc;
      ideal.efficiency = 1;
      const StepPlan p = plan_step(m, one, Batch{b.micro_batch, 1}, ideal);
      mc.efficiency = p.pipeline_s / (calibrate_ms / 1e3 - p.optimizer_s);
      std::printf("calibrated: one rank measured %.1f ms -> efficiency %.3f of %.4g GFLOP/s\n", calibrate_ms,
                  mc.efficiency, mc.peak_tflops(g.dtype) * 1e3);
    }
    std::fputs(report(m, g, b, mc, plan_step(m, g, b, mc), tokens).c_str(), stdout);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom_plan: %s\n", e.what());
    return 1;
  }
  return 0;
}
