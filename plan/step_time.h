// A planned step, put together: the pipeline's time with its bubble, the
// communication that is not hidden, the optimizer, and what that makes of
// the machine (MFU).
//
// Pipeline (Narayanan et al. 2021, section 2.2): with p stages, m
// micro-batches and v chunks per stage (interleaved 1F1B), each stage idles
// for (p - 1) / v micro-batch slots while the pipeline fills and drains:
//     T_pipeline      = m t_max + (p - 1) / v x t_mean
//     bubble          = (p - 1) / (v m + p - 1)  (idle share of T_pipeline, equal stages;
//                                                 --print-schedule and chapter 4 use the same)
//     bubble/compute  = (p - 1) / (v m)          (Megatron's form: idle over useful time)
// t = one micro-batch's forward + backward on a stage, its tp collectives and
// its p2p sends included (they are on the critical path); t_max the slowest
// stage's, which sets the steady state; t_mean the fill and drain.
//
// After the pipeline (loom, like Megatron, finishes the gradient reduction
// after the last micro-batch's backward):
//   dp      the bucketed all-reduce (or ZeRO's reduce-scatter) overlaps the
//           last micro-batch's backward; what is left shows. ZeRO's all-gather
//           of the updated params comes after the optimizer: all of it shows.
//   embedding group  all of it shows.
//   ep      the all-to-alls (plan/moe_model.h) are on the critical path of
//           every micro-batch: the experts wait for their tokens; the experts'
//           gradients are reduced over their expert-dp group (dp / ep ranks)
//           beside the dense ones', overlapping the same backward.
//   cp      ring attention's hops overlap its blocks' math; what the overlap
//           condition leaves (plan/cp_model.h) is on the critical path of
//           every micro-batch.
//   optimizer  AdamW streams its state once: per element it owns, ~32 bytes
//           (grad 4, main param 4 + 4, m 4 + 4, v 4 + 4, + the model param's
//           copy), plus 8 per param for the grad norm and the zeroing of the
//           grad buffer, at the device's memory bandwidth.
//
// On this CPU with more ranks than cores, T_pipeline is at least every
// rank's compute over the cores (ranks waiting for messages yield theirs),
// plus, per synchronous tp collective and p2p transfer on the critical path,
// the time its group waits for its ranks to be scheduled (Machine::handoff_us).
//
//   step = T_pipeline + dp exposed + embedding + optimizer
//   MFU  = model FLOPs per step / (step x ranks x peak)   (Chowdhery et al.
//          2022, PaLM, appendix B; no recomputation counted)
//   HFU  = the same with recomputation's FLOPs: what Megatron's papers report.
#pragma once

#include <string>
#include <vector>

#include "plan/comm_model.h"
#include "plan/compute_model.h"
#include "plan/cp_model.h"
#include "plan/memory_model.h"

namespace loom::plan {

// (p - 1) / (v m + p - 1): the share of the pipeline's time a stage idles.
// (ZB-H1: (p - 1) / (3 m + p - 1), F = B = W.)
double bubble_fraction(const Grid& g, int64_t micro_batches);
// (p - 1) / (v m): Megatron's bubble time over compute time (Narayanan et al. 2021).
double bubble_over_compute(const Grid& g, int64_t micro_batches);

struct StagePlan {
  RankMemory memory;
  StageCompute compute;          // one micro-batch
  GroupTraffic tp, pp, cp, ep;   // one micro-batch (ep: plan/moe_model.h)
  double cp_exposed_s = 0;       // one micro-batch: the ring's hops not hidden behind its math
  double micro_batch_s = 0;      // compute + tp + pp + cp exposed + ep
};

struct StepPlan {
  std::vector<StagePlan> stages;  // one per pipeline rank
  GroupTraffic dp, embedding;     // per step, on the stage that holds the most params
  GroupTraffic expert_dp;         // per step: the experts' gradients over their expert-dp group (dp / ep)
  double pipeline_s = 0, bubble_s = 0, dp_exposed_s = 0, embedding_s = 0, optimizer_s = 0, step_s = 0;
  double compute_s = 0;           // the slowest stage's pure compute over the step
  double tp_s = 0, pp_s = 0, cp_s = 0, ep_s = 0;  // their time on the critical path over the step
  double cores_s = 0;             // this CPU: what taking turns on too few cores adds
  double model_flops = 0, hardware_flops = 0, mfu = 0, hfu = 0;
  double tokens_per_s = 0;
  int worst_memory_stage = 0;
  bool fits = true;
  std::string binds;              // the constraint that binds, in words
};

StepPlan plan_step(const ModelShape& m, const Grid& g, const Batch& b, const Machine& mc);

// Training on `tokens` tokens (loom_plan --tokens): whole steps of
// tokens_per_step, each s.step_s long; device-hours count every rank.
struct TrainTime {
  double steps = 0, seconds = 0, device_hours = 0;
};
TrainTime time_to_train(const StepPlan& s, const ModelShape& m, const Grid& g, const Batch& b, double tokens);

}  // namespace loom::plan
