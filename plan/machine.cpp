#include "plan/machine.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "tensor/generator.h"
#include "tensor/ops.h"
#include "tensor/error.h"

namespace loom::plan {

namespace {

// NVIDIA H100 SXM5 80GB datasheet: 989 TFLOP/s dense BF16 (1979 is with 2:4
// sparsity), 67 TFLOP/s FP32 (no TF32), 80 GB HBM3 at 3.35 TB/s; NVLink 4:
// 900 GB/s bidirectional = 450 GB/s each way per GPU; one 400 Gb/s NDR
// InfiniBand NIC per GPU in a DGX H100 (= 50 GB/s each way); 8 GPUs a node.
// efficiency 0.45: an assumption (no H100 measured here): below the A100's
// 0.52, since a faster tensor core is harder to keep fed.
Machine h100() {
  Machine m;
  m.name = "H100 SXM 80GB (NVLink 4 + 400 Gb/s InfiniBand per GPU)";
  m.peak_tflops_16 = 989, m.peak_tflops_32 = 67, m.efficiency = 0.45;
  m.memory_gib = 80, m.memory_bw_gbs = 3350;
  m.devices_per_node = 8, m.intra_gbs = 450, m.inter_gbs = 50;
  m.latency_us = 10, m.inter_latency_us = 15;
  return m;
}

// NVIDIA H200 SXM 141GB datasheet: the H100's tensor cores (989 TFLOP/s dense
// BF16, 67 FP32) with 141 GB of HBM3e at 4.8 TB/s; NVLink 4 and one 400 Gb/s
// NIC per GPU as the DGX H100 (a DGX H200 is the same board). efficiency 0.45
// as the H100's: an assumption, not a measurement (the faster memory helps
// the optimizer step, which the planner times by memory_bw_gbs, not the GEMMs).
Machine h200() {
  Machine m = h100();
  m.name = "H200 SXM 141GB (NVLink 4 + 400 Gb/s InfiniBand per GPU)";
  m.memory_gib = 141, m.memory_bw_gbs = 4800;
  return m;
}

// A student's laptop, as datasheet numbers so a page can plan for one without
// timing it (--machine cpu measures this machine instead): 8 cores with AVX2
// and 16 GiB, one rank per core, MPI over shared memory as measure_this_cpu
// models it. Per core: loom's fp32 GEMM at ~80 GF/s (issue 47 measured
// 78-89% of a Zen 3 core's 94.8 GF/s FMA ceiling at large shapes), bf16
// computed in fp32 (AVX2 has no bf16 products), a core's memcpy ~20 GB/s.
Machine laptop() {
  Machine m;
  m.name = "laptop: 8 AVX2 cores, 16 GiB, MPI over shared memory (assumed, not measured)";
  m.peak_tflops_32 = m.peak_tflops_16 = 0.08, m.efficiency = 0.5;
  m.memory_gib = 16, m.memory_bw_gbs = 20;
  m.devices_per_node = 8, m.one_node = true;
  m.intra_gbs = m.inter_gbs = m.memory_bw_gbs / 2, m.link_efficiency = 1.0;
  m.latency_us = m.inter_latency_us = 20, m.handoff_us = 440;  // as measure_this_cpu's
  return m;
}

// NVIDIA A100 SXM4 80GB datasheet: 312 TFLOP/s dense BF16/FP16, 19.5 FP32,
// 80 GB HBM2e at 2.04 TB/s; NVLink 3: 600 GB/s bidirectional = 300 each way;
// DGX A100 (Megatron-LM's Selene): eight 200 Gb/s HDR InfiniBand NICs, one
// per GPU (= 25 GB/s each way).
// efficiency 0.52: calibrated on one published run, Narayanan et al. 2021
// (arXiv 2104.04473) Table 1's first row: 1.7B parameters on 32 GPUs with
// data parallelism only reached 137 TFLOP/s per GPU (44% of peak, counting
// recomputation); 0.52 is the efficiency with which this planner, adding its
// own communication and optimizer time, predicts those 137. Every other row
// of that table is then a prediction (bench/plan_megatron.sh, docs/09-planner.md).
Machine a100() {
  Machine m;
  m.name = "A100 SXM 80GB (NVLink 3 + 200 Gb/s InfiniBand per GPU)";
  m.peak_tflops_16 = 312, m.peak_tflops_32 = 19.5, m.efficiency = 0.52;
  m.memory_gib = 80, m.memory_bw_gbs = 2039;
  m.devices_per_node = 8, m.intra_gbs = 300, m.inter_gbs = 25;
  m.latency_us = 10, m.inter_latency_us = 15;
  return m;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Best of a few timings: on a shared machine the fastest run is the one least
// disturbed by other processes.
template <class F>
double best_seconds(F&& f, int repeats) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

double memory_gib_of_this_machine() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kb = 0;
  while (f >> key >> kb)
    if (key == "MemTotal:") return kb / (1024.0 * 1024.0);  // kB here means KiB
  return 0;
}

}  // namespace

std::vector<std::string> machine_names() { return {"h100", "h200", "a100", "laptop", "cpu"}; }

Machine machine_by_name(const std::string& name) {
  if (name == "h100") return h100();
  if (name == "h200") return h200();
  if (name == "a100") return a100();
  if (name == "laptop") return laptop();
  LOOM_CHECK(false, "loom_plan: unknown machine '", name, "' (h100, h200, a100, laptop, cpu)");
  return {};
}

Machine measure_this_cpu(const ModelShape& model, const Batch& batch) {
  Machine m;
  m.name = "this CPU, MPI over shared memory (measured now)";
  ops::set_num_threads(1);  // train_gpt's default --threads 1: one core per rank
  // loom's fp32 GEMM at the MLP's shape: the largest matmul of a layer.
  Generator gen(0);
  const int64_t M = batch.micro_batch * model.seq, K = model.width, N = 4 * model.width;
  Tensor a = randn({M, K}, gen), b = randn({K, N}, gen);
  ops::matmul(a, b);  // warm-up
  const double gemm_s = best_seconds([&] { ops::matmul(a, b); }, 5);
  m.peak_tflops_32 = 2.0 * double(M) * double(K) * double(N) / gemm_s / 1e12;
  m.peak_tflops_16 = m.peak_tflops_32;  // loom computes bf16 in fp32 on CPU (convert in, round out)
  // One core's copy bandwidth (read + write counted once, as memcpy's size).
  std::vector<char> src(64 << 20, 1), dst(64 << 20);
  std::memcpy(dst.data(), src.data(), src.size());
  const double copy_s = best_seconds([&] { std::memcpy(dst.data(), src.data(), src.size()); }, 3);
  m.memory_bw_gbs = double(src.size()) / copy_s / 1e9;
  // Efficiency: the share of the GEMM rate a whole step reaches (layernorm,
  // softmax, GELU, AdamW and loom's per-op overhead are not GEMMs). 0.5 is a
  // first guess; loom_plan --efficiency overrides it, and docs/09-planner.md shows
  // it calibrated on a one-rank run.
  m.efficiency = 0.5;
  m.memory_gib = memory_gib_of_this_machine();
  m.devices_per_node = int(std::max(1u, std::thread::hardware_concurrency()));
  m.one_node = true;
  // MPI over shared memory copies twice (sender -> shared segment ->
  // receiver): a message moves at about half of one core's memcpy rate.
  m.intra_gbs = m.inter_gbs = m.memory_bw_gbs / 2;
  m.link_efficiency = 1.0;
  // Per message: MPI's shared-memory latency (~1 us) plus loom's CommQueue
  // hand-off to its worker thread; 20 us is an assumption (--latency-us).
  m.latency_us = m.inter_latency_us = 20;
  // More ranks than cores: a collective completes only once every rank of its
  // group has been scheduled, and the ones that arrived first spin on their
  // core (loom polls MPI flat out while a caller waits, parallel/comm/process_group_mpi.cpp)
  // until the scheduler preempts them. Calibrated here (bench/plan_check.sh,
  // 4 ranks on 2 cores, load average 2-3): the step time that tp 4, dp 2 x tp 2
  // and pp 2 x tp 2 + SP lose beyond compute / cores and the bytes, divided by
  // their synchronous collectives, came out 0.43-0.44 ms each (--handoff-us).
  m.handoff_us = 440;
  return m;
}

}  // namespace loom::plan
