// bench_gpt_step: one GPT training step, timed, on the CPU or one GPU; the
// loom side of bench/gpt_step.sh, which runs this and bench/gpt_step.py
// (PyTorch) back to back with the same config and prints the ratio.
//
// One step = forward + cross-entropy + backward + AdamW step + zero_grad, the
// train_gpt setup: nn::GPT (dropout 0, plain-matmul attention), AdamW with
// nanoGPT's param groups (optim/param_groups.h). Random tokens; only the time
// matters. --dtype fp32 (the default) steps optim::AdamW on the fp32 model;
// --dtype bf16 is train_gpt's --dtype bf16: the model's params and
// activations bf16, the MixedPrecisionOptimizer's AdamW on fp32 main params.
// Its GEMMs run natively in bf16 where the CPU can (tensor/cpu/gemm_bf16.h;
// LOOM_GEMM_BF16=fp32 sends them through fp32, for comparison).
//
// --device cuda[:N] runs it on a GPU the way train_gpt --device cuda does: the
// model built on the CPU by the seeded generators, its params moved in place,
// the tokens copied up once. The step's loss.item() is its only host wait, so
// the clock around a step measures the GPU's work (plus whatever launch
// overhead the host adds: on small models that is the point, issue 13).
// --tf32 lets cuBLAS use TF32 tensor cores (off by default, as in train_gpt).
//
// Configs (issue 3, "Speed"; issue 13 for gpt124m):
//   small:   4 layers,  4 heads, 128 embd, block   64, batch 16, vocab 65
//   medium:  6 layers,  6 heads, 384 embd, block  256, batch  8, vocab 65
//   gpt124m: 12 layers, 12 heads, 768 embd, block 1024, batch  8, vocab 65
//            (GPT-2 124M's shape with the char vocabulary: a GPU config; one
//            CPU step is ~1.2 TFLOP, minutes on a laptop)
//
// --profile (issue 47): after the timed steps, as many steps again with every
// op's exclusive time recorded (tensor/profile.h), printed per op - GEMMs by
// shape - with its share of the step, its GF/s and GB/s against this
// machine's FMA ceiling and copy bandwidth (bench/ceiling.h, measured first),
// then summed by kind (GEMM, attention, norms, softmax and cross-entropy,
// elementwise, AdamW, copies, allocation, and the rest: autograd's own work).
// At --threads 1 the rates are of each op's CPU time, beside one core's FMA
// rate in CPU time: numbers that hold on a busy machine (a build running
// beside the benchmark), where wall times would count the waits for a core.
//
// --per-step (issue 47) prints a line after the first, each timed step's CPU ms in order
// (step_times_cpu=a,b,...): whether a slow median is a few slow steps or all.
//
// Usage: bench_gpt_step [--config small|medium|gpt124m] [--threads N] [--warmup W] [--steps S]
//                       [--dtype fp32|bf16] [--device cpu|cuda[:N]] [--tf32] [--profile] [--per-step]
// Prints one line:  loom <config> threads=<n> ms_per_step=<median> tokens_per_s=<t> min_ms=<fastest step>
//   gemm=<onednn|openblas> dtype=<fp32|bf16> bf16_gemm=<bf16|fp32> device=<cpu|cuda:N> peak_mib=<peak>
//   (gemm: the fp32 GEMM library, LOOM_GEMM=openblas picks OpenBLAS; bf16_gemm:
//   how bf16 products run on the CPU, natively or through fp32; peak_mib: the
//   device's peak live tensor bytes over the timed steps, memory_stats;
//   cpu_ms: the median step in the main thread's CPU time, which a busy
//   machine's waits for a core do not inflate - at --threads 1 the step's cost)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/variable.h"
#include "optim/param_groups.h"
#include "nn/gpt.h"
#include "nn/loss.h"
#include "optim/adamw.h"
#include "optim/mixed_precision_optimizer.h"
#include "bench/ceiling.h"
#include "tensor/cuda/cuda.h"
#include "tensor/profile.h"
#include "tensor/storage.h"

using namespace loom;

namespace {

// The kind an op's profile name belongs to, for the summary.
const char* kind_of(const std::string& name) {
  auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
  if (starts("linear bwd bias")) return "elementwise, sums";  // the bias gradient's column sums, no product
  if (starts("linear") || starts("matmul")) return "GEMM";
  if (name.find("attention") != std::string::npos) return "attention";
  if (starts("layer_norm") || starts("rms_norm")) return "norms";
  if (name.find("softmax") != std::string::npos || starts("cross_entropy")) return "softmax, cross-entropy";
  if (starts("adamw")) return "AdamW";
  if (starts("copy") || starts("convert")) return "copies";
  if (starts("allocate") || starts("free")) return "allocation";
  if (starts("embedding")) return "embedding";
  return "elementwise, sums";
}

// Runs `steps` more steps with the op profile on and prints it (see the top).
template <class Step>
void print_op_profile(Step& step, int steps, double median_ms, int threads) {
  const bool cpu_time = threads == 1;  // the rates of CPU time (see the top)
  const std::vector<double> fma = bench::fma_rates(threads, 3);
  const double ceiling = cpu_time ? bench::fma_rate_cpu_time() : *std::max_element(fma.begin(), fma.end());
  const double bandwidth = bench::copy_bandwidth_gbs(threads);
  profile::start();
  auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = profile::thread_cpu_seconds();
  for (int i = 0; i < steps; ++i) step();
  const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps;
  const double cpu_ms = (profile::thread_cpu_seconds() - cpu0) * 1e3 / steps;
  const double step_ms = cpu_time ? cpu_ms : wall_ms;  // what the shares and the rest are of
  std::map<std::string, profile::Entry> ops = profile::stop();
  std::vector<std::pair<std::string, profile::Entry>> rows(ops.begin(), ops.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  std::printf("op profile: %d steps; a step profiled %.2f ms wall, %.2f ms CPU (%.2f timed above); %s FMA ceiling "
              "%.1f GF/s%s, copy bandwidth %.1f GB/s, on %d thread(s)\n", steps, wall_ms, cpu_ms, median_ms,
              bench::kIsa, ceiling, cpu_time ? " of CPU time" : "", bandwidth, threads);
  std::printf("shares and rates of %s time\n", cpu_time ? "the thread's CPU" : "wall");
  std::printf("%-34s %6s %9s %9s %7s %8s %6s %7s %6s\n", "op (exclusive time)", "calls", "wall ms", "CPU ms", "% step",
              "GF/s", "% FMA", "GB/s", "% bw");
  std::map<std::string, double> by_kind;
  double in_ops = 0;
  if (cpu_time)
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.cpu_seconds > b.second.cpu_seconds; });
  for (const auto& [name, e] : rows) {
    const double s = cpu_time ? e.cpu_seconds : e.seconds, ms = s * 1e3 / steps;
    in_ops += ms;
    by_kind[kind_of(name)] += ms;
    if (ms < 0.005 * step_ms) continue;  // below half a percent: only in the kinds' sums
    const double gfs = e.flops / s / 1e9, gbs = e.bytes / s / 1e9;
    std::printf("%-34s %6lld %9.3f %9.3f %6.1f%% %8.1f %5.0f%% %7.1f %5.0f%%\n", name.c_str(),
                (long long)(e.calls / steps), e.seconds * 1e3 / steps, e.cpu_seconds * 1e3 / steps,
                100 * ms / step_ms, gfs, 100 * gfs / ceiling, gbs, 100 * gbs / bandwidth);
  }
  by_kind["rest (autograd, glue)"] = step_ms - in_ops;
  std::printf("by kind:");
  for (const auto& [kind, ms] : by_kind) std::printf("  %s %.2f ms (%.0f%%)", kind.c_str(), ms, 100 * ms / step_ms);
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string config = "small", dtype_name = "fp32", device_name = "cpu";
  int threads = 1, warmup = 3, steps = 15;
  bool tf32 = false, profile_ops = false, per_step = false;
  const char* usage =
      "usage: %s [--config small|medium|gpt124m] [--threads N] [--warmup W] [--steps S] [--dtype fp32|bf16]"
      " [--device cpu|cuda[:N]] [--tf32] [--profile] [--per-step]\n";
  for (int i = 1; i < argc; i += 2) {
    const bool is_tf32 = !std::strcmp(argv[i], "--tf32"), is_profile = !std::strcmp(argv[i], "--profile");
    const bool is_per_step = !std::strcmp(argv[i], "--per-step");
    if (is_tf32 || is_profile || is_per_step) {
      tf32 |= is_tf32, profile_ops |= is_profile, per_step |= is_per_step;
      --i;  // a flag: no value to skip
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, usage, argv[0]);
      return 2;
    }
    if (!std::strcmp(argv[i], "--config")) config = argv[i + 1];
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--warmup")) warmup = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--dtype")) dtype_name = argv[i + 1];
    else if (!std::strcmp(argv[i], "--device")) device_name = argv[i + 1];
    else {
      std::fprintf(stderr, usage, argv[0]);
      return 2;
    }
  }
  if (dtype_name != "fp32" && dtype_name != "bf16") {
    std::fprintf(stderr, "unknown --dtype %s (fp32, bf16)\n", dtype_name.c_str());
    return 2;
  }
  const bool bf16 = dtype_name == "bf16";
  nn::GPTConfig cfg;  // vocab 65, dropout 0
  int64_t batch;
  if (config == "small") {
    cfg.n_layer = 4; cfg.n_head = 4; cfg.n_embd = 128; cfg.block_size = 64; batch = 16;
  } else if (config == "medium") {
    cfg.n_layer = 6; cfg.n_head = 6; cfg.n_embd = 384; cfg.block_size = 256; batch = 8;
  } else if (config == "gpt124m") {
    cfg.n_layer = 12; cfg.n_head = 12; cfg.n_embd = 768; cfg.block_size = 1024; batch = 8;
  } else {
    std::fprintf(stderr, "unknown --config %s (small, medium, gpt124m)\n", config.c_str());
    return 2;
  }
  ops::set_num_threads(threads);
  Device device = kCPU;
  try {
    device = Device(device_name);
    if (!device.is_cpu()) {
      if (cuda::device_count() == 0) {
        std::fprintf(stderr, "--device %s: no GPU (%s)\n", device_name.c_str(), cuda::unavailable_reason().c_str());
        return 1;
      }
      cuda::set_allow_tf32(tf32);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "--device %s: %s\n", device_name.c_str(), e.what());
    return 1;
  }

  nn::GPT model(cfg);
  model.to(device);  // the CPU-initialised params, moved in place before the optimizer makes its state
  std::unique_ptr<optim::AdamW> adamw;                     // fp32
  std::unique_ptr<optim::MixedPrecisionOptimizer> mixed;  // bf16
  if (bf16) {
    model.to(kBFloat16);
    mixed = std::make_unique<optim::MixedPrecisionOptimizer>(optim::gpt_param_groups(model, 1e-3, 0.1));
  } else {
    adamw = std::make_unique<optim::AdamW>(optim::gpt_param_groups(model, 1e-3, 0.1));
  }
  const std::vector<Tensor> params = model.parameters();
  Generator gen(0);
  Tensor idx = randint(0, cfg.vocab_size, {batch, cfg.block_size}, gen);
  Tensor targets = randint(0, cfg.vocab_size, {batch, cfg.block_size}, gen);
  idx = ops::to(idx, device);
  targets = ops::to(targets, device);

  auto step = [&] {
    Tensor loss = nn::cross_entropy_loss(model.forward(idx), targets);
    autograd::backward(loss);
    if (bf16) {
      mixed->step();
      autograd::zero_grad(params);
    } else {
      adamw->step();
      adamw->zero_grad();
    }
    return loss.item<double>();
  };

  for (int i = 0; i < warmup; ++i) step();
  reset_peak_memory_stats(device);
  std::vector<double> ms, cpu_ms;  // wall and this thread's CPU time per step
  for (int i = 0; i < steps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    const double cpu0 = profile::thread_cpu_seconds();
    step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    cpu_ms.push_back((profile::thread_cpu_seconds() - cpu0) * 1e3);
  }
  const std::vector<double> cpu_in_order = cpu_ms;  // --per-step's (the medians sort)
  auto median_of = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  const double median = median_of(ms), median_cpu = median_of(cpu_ms);
  std::printf(
      "loom %s threads=%d ms_per_step=%.2f tokens_per_s=%.0f min_ms=%.2f gemm=%s dtype=%s bf16_gemm=%s device=%s "
      "peak_mib=%.1f cpu_ms=%.2f\n",
      config.c_str(), threads, median, double(batch * cfg.block_size) / (median / 1000.0), ms.front(),
      ops::gemm_library().c_str(), dtype_name.c_str(), ops::bf16_gemm().c_str(), device.str().c_str(),
      double(memory_stats(device).peak_bytes) / (1 << 20), median_cpu);
  if (per_step) {
    std::printf("step_times_cpu=");
    for (size_t i = 0; i < cpu_in_order.size(); ++i) std::printf("%s%.2f", i ? "," : "", cpu_in_order[i]);
    std::printf("\n");
  }
  if (profile_ops) {
    if (!device.is_cpu()) {
      std::fprintf(stderr, "--profile times CPU ops (a GPU op's time is its launch)\n");
      return 2;
    }
    print_op_profile(step, steps, median, threads);
  }
  return 0;
}
