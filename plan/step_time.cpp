#include "plan/step_time.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "parallel/pipeline_parallel/partition.h"
#include "plan/moe_model.h"

namespace loom::plan {

double bubble_fraction(const Grid& g, int64_t micro_batches) {
  if (g.schedule == "zb-h1") return double(g.pp - 1) / (3 * double(micro_batches) + double(g.pp - 1));
  // ZB-V, DualPipeV: p - 1 idle chunk slots of 6 m (zbv_schedule.h)
  if (g.schedule == "zb-v" || g.schedule == "dualpipev")
    return double(g.pp - 1) / (6 * double(micro_batches) + double(g.pp - 1));
  return double(g.pp - 1) / (double(g.virtual_stages) * double(micro_batches) + double(g.pp - 1));
}

double bubble_over_compute(const Grid& g, int64_t micro_batches) {
  return double(g.pp - 1) / (double(g.virtual_stages) * double(micro_batches));
}

TrainTime time_to_train(const StepPlan& s, const ModelShape& m, const Grid& g, const Batch& b, double tokens) {
  TrainTime t;
  const double per_step = double(b.tokens_per_step(m, g));
  t.steps = std::ceil(tokens / per_step);
  t.seconds = t.steps * s.step_s;
  t.device_hours = t.seconds * double(g.world()) / 3600.0;
  return t;
}

namespace {

// The binding constraint: memory first (a run that does not fit does not
// run), else the largest share of the step that is not useful compute.
std::string binding_constraint(const StepPlan& s, const Machine& mc) {
  char buf[256];
  if (!s.fits) {
    std::snprintf(buf, sizeof buf, "memory: pipeline rank %d needs %.1f GiB of %.0f GiB", s.worst_memory_stage,
                  s.stages[size_t(s.worst_memory_stage)].memory.total() / 1073741824.0, mc.memory_gib);
    return buf;
  }
  const double comm = s.tp_s + s.pp_s + s.cp_s + s.ep_s + s.dp_exposed_s + s.embedding_s;
  struct Share {
    const char* name;
    double seconds;
  };
  std::vector<Share> shares{{"pipeline bubble", s.bubble_s},
                            {"communication", comm},
                            {"optimizer step", s.optimizer_s},
                            {"cores (more ranks than cores: they take turns)", s.cores_s}};
  const Share worst = *std::max_element(shares.begin(), shares.end(),
                                        [](const Share& a, const Share& b) { return a.seconds < b.seconds; });
  if (worst.seconds < 0.1 * s.step_s) {
    std::snprintf(buf, sizeof buf, "compute (every overhead < 10%% of the step; largest: %s %.0f%%)", worst.name,
                  100 * worst.seconds / s.step_s);
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%s: %.0f%% of the step", worst.name, 100 * worst.seconds / s.step_s);
  return buf;
}

}  // namespace

StepPlan plan_step(const ModelShape& m, const Grid& g, const Batch& b, const Machine& mc) {
  StepPlan s;
  double t_max = 0, t_sum = 0;
  int slowest = 0, biggest = 0;
  // 1. Each pipeline rank: its memory, and one micro-batch's compute and communication.
  for (int st = 0; st < g.pp; ++st) {
    StagePlan sp;
    sp.memory = memory_on_stage(m, g, b, st);
    sp.compute = stage_compute(m, g, b, mc, st);
    sp.tp = tp_per_micro_batch(m, g, b, mc, st);
    sp.pp = pp_per_micro_batch(m, g, b, mc, st);
    sp.cp = cp_per_micro_batch(m, g, b, mc, st);
    sp.cp_exposed_s = cp_exposed_per_micro_batch(m, g, b, mc, st);
    sp.ep = ep_per_micro_batch(m, g, b, mc, st);
    sp.micro_batch_s = sp.compute.forward_s + sp.compute.backward_s + sp.tp.seconds + sp.pp.seconds +
                       sp.cp_exposed_s + sp.ep.seconds;
    if (sp.micro_batch_s > t_max) t_max = sp.micro_batch_s, slowest = st;
    t_sum += sp.micro_batch_s;
    s.stages.push_back(sp);
    if (sp.memory.num_params > s.stages[size_t(biggest)].memory.num_params) biggest = st;
    if (sp.memory.total() > s.stages[size_t(s.worst_memory_stage)].memory.total()) s.worst_memory_stage = st;
  }
  // 2. The pipeline: m micro-batches at the slowest stage's pace, plus the fill and drain.
  const double mb = double(b.micro_batches), fill = double(g.pp - 1) / g.virtual_stages;
  const StagePlan& slow = s.stages[size_t(slowest)];
  // ZB-H1 (zero_bubble_schedule.h) idles (p - 1)(F + B - W) instead of (p - 1)(F + B + W): with the
  // backward split evenly (B = W: a linear's dX and dW are one GEMM each), (p - 1)(F + transfers).
  // ZB-V and DualPipeV idle (p - 1) chunk slots, each F / 2 with the same even split: fill = (p - 1) / v
  // above, and the same F + transfers.
  double t_fill = t_sum;
  if (parallel::schedule_splits_backward(g.schedule))
    for (const StagePlan& sp : s.stages) t_fill -= sp.compute.backward_s;
  s.pipeline_s = mb * t_max + fill * t_fill / g.pp;
  s.bubble_s = fill * t_fill / g.pp;
  s.compute_s = mb * (slow.compute.forward_s + slow.compute.backward_s);
  s.tp_s = mb * slow.tp.seconds, s.pp_s = mb * slow.pp.seconds, s.cp_s = mb * slow.cp_exposed_s;
  s.ep_s = mb * slow.ep.seconds;
  // More ranks than cores (this CPU): a rank waiting for a message yields its
  // core, so the ranks take turns; the step can then be no shorter than all
  // ranks' compute spread over the cores (plus the critical path's messages).
  if (mc.one_node && g.world() > mc.devices_per_node) {
    double busy = 0;  // core-seconds of compute per step, every rank
    for (const StagePlan& sp : s.stages) busy += mb * (sp.compute.forward_s + sp.compute.backward_s);
    busy *= double(g.dp) * g.tp * g.cp;
    // Every synchronous tp collective and p2p transfer of the slowest stage
    // also waits for its peers to be scheduled (Machine::handoff_us).
    const double handoffs = mb * (slow.tp.ops + slow.pp.ops) * mc.handoff_us * 1e-6;
    const double cores_bound = busy / mc.devices_per_node + s.tp_s + s.pp_s + handoffs;
    if (cores_bound > s.pipeline_s) {
      s.cores_s = cores_bound - s.pipeline_s;
      s.pipeline_s = cores_bound;
    }
  }

  // 3. After the pipeline, on the rank with the most parameters.
  const StagePlan& big = s.stages[size_t(biggest)];
  // The experts' gradients go over their expert-dp group (dp / ep ranks; its span taken as if contiguous).
  const int64_t dense = big.memory.num_params - big.memory.expert_params, experts = big.memory.expert_params;
  const Grid edp = expert_dp_grid(g);
  s.dp = dp_per_step(dense, g, mc);
  if (experts > 0) {
    s.expert_dp = dp_per_step(experts, edp, mc);
    s.expert_dp.group = "expert-dp";
  }
  // ZeRO's all-gather of the updated params comes after the optimizer step: none of it overlaps.
  const double zero_gather =
      g.zero ? all_gather_seconds(double(dtype_bytes(g.dtype)) * double(dense), g.dp * g.cp,
                                  link_for_span(mc, int64_t(g.tp) * g.cp * g.dp)) +
                   all_gather_seconds(double(dtype_bytes(g.dtype)) * double(experts), edp.dp * g.cp,
                                      link_for_span(mc, int64_t(g.tp) * g.cp * edp.dp))
             : 0;
  s.dp_exposed_s =
      zero_gather + std::max(0.0, s.dp.seconds + s.expert_dp.seconds - zero_gather - big.compute.backward_s);
  s.embedding = embedding_per_step(m, g, mc);
  s.embedding_s = s.embedding.seconds;
  const double owned = g.zero ? double(dense) / (g.dp * g.cp) + double(experts) / (edp.dp * g.cp)
                              : double(big.memory.num_params);
  s.optimizer_s = (32.0 * owned + 8.0 * double(big.memory.num_params)) / (mc.memory_bw_gbs * 1e9);
  s.step_s = s.pipeline_s + s.dp_exposed_s + s.embedding_s + s.optimizer_s;

  // 4. What that makes of the machine.
  s.model_flops = model_flops_per_step(m, g, b);
  const double recompute_flops = s.model_flops / 3 *
                                 recompute_forward_flops(m, g, double(m.layers) * layer_forward_flops(m)) /
                                 (double(m.layers) * layer_forward_flops(m) + head_forward_flops(m));
  s.hardware_flops = s.model_flops + recompute_flops;
  // The devices the run occupies (on this CPU: its cores, however many ranks share them).
  const int devices = mc.one_node ? std::min(g.world(), mc.devices_per_node) : g.world();
  const double peak = mc.peak_tflops(g.dtype) * 1e12 * devices;
  s.mfu = s.model_flops / (s.step_s * peak);
  s.hfu = s.hardware_flops / (s.step_s * peak);
  s.tokens_per_s = double(b.tokens_per_step(m, g)) / s.step_s;
  s.fits = s.stages[size_t(s.worst_memory_stage)].memory.total() <= mc.memory_gib * 1073741824.0;
  s.binds = binding_constraint(s, mc);
  return s;
}

}  // namespace loom::plan
