// The machines loom_plan knows: what one device computes, holds and moves.
// Every number says where it comes from (a datasheet, or a measurement on
// this machine); the planner's predictions are only as good as these.
#pragma once

#include <string>
#include <vector>

#include "plan/config.h"

namespace loom::plan {

struct Machine {
  std::string name;
  double peak_tflops_16 = 0;   // dense bf16/fp16 matrix math, per device (TFLOP/s)
  double peak_tflops_32 = 0;   // fp32 without TF32, per device
  double efficiency = 0.5;     // fraction of peak a transformer layer's math reaches (GEMMs + the rest)
  double memory_gib = 0;       // capacity per device (GiB = 2^30 bytes: an "80GB" A100 or H100 holds 80 GiB)
  double memory_bw_gbs = 0;    // HBM / DRAM bandwidth per device (GB/s): the optimizer step is bound by it
  int devices_per_node = 8;    // ranks that share the fast link (NVLink / shared memory)
  double intra_gbs = 0;        // per direction, per device, inside a node (GB/s)
  double inter_gbs = 0;        // per direction, per device, across nodes (GB/s)
  double link_efficiency = 0.8;  // share of the line rate a ring collective reaches (NCCL "bus bandwidth")
  double latency_us = 10;      // per ring step (one message), inside a node
  double inter_latency_us = 10;
  bool one_node = false;         // every rank on this one machine (the CPU): ranks beyond its cores share them
  // With more ranks than cores: what one synchronous collective or transfer
  // costs on top of its bytes, while its group's ranks wait to be scheduled
  // (step_time.h). 0 on the GPU machines.
  double handoff_us = 0;
  double peak_tflops(const std::string& dtype) const { return dtype == "fp32" ? peak_tflops_32 : peak_tflops_16; }
};

// "h100", "h200", "a100", "laptop": datasheet numbers (see machine.cpp). "cpu": this machine,
// measured by measure_this_cpu.
std::vector<std::string> machine_names();
Machine machine_by_name(const std::string& name);

// This CPU, with MPI over shared memory: one rank per core; the GF/s of
// loom's own fp32 GEMM at the model's MLP shape [b s, h] x [h, 4h] on one
// thread, and memcpy bandwidth on one core, both timed here and now.
Machine measure_this_cpu(const ModelShape& model, const Batch& batch);

}  // namespace loom::plan
