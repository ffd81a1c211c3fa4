#include "plan/wasm/schedule_picture.h"

#include <cstdio>

#include "parallel/pipeline_parallel/dualpipev_schedule.h"
#include "parallel/pipeline_parallel/interleaved_schedule.h"
#include "parallel/pipeline_parallel/partition.h"
#include "parallel/pipeline_parallel/zbv_schedule.h"
#include "parallel/pipeline_parallel/zero_bubble_schedule.h"
#include "parallel/trace/schedule_svg.h"

namespace loom::plan {

namespace {

using parallel::ScheduledOp;

// Stage r's order under AFAB and plain 1F1B: the loops of
// train_step_pipeline_afab / _1f1b (parallel/pipeline_parallel/pipeline_schedule.cpp)
// written as a list. Interleaved 1F1B, ZB-H1 and the V's (ZB-V, DualPipeV)
// have theirs as functions.
// A schedule not drawn here yet: no order (and no picture, which
// tests/planner_wasm/equals_cli.js reports).
std::vector<ScheduledOp> order(const Grid& g, int stage, int m) {
  if (g.schedule == "zb-v") return parallel::zb_v_order(g.pp, stage, m);
  if (g.schedule == "dualpipev") return parallel::dualpipev_order(g.pp, stage, m);
  if (g.virtual_stages > 1) return parallel::interleaved_order(g.pp, stage, g.virtual_stages, m);
  if (g.schedule == "zb-h1") return parallel::zb_h1_order(g.pp, stage, m);
  if (g.schedule != "1f1b" && g.schedule != "afab") return {};
  std::vector<ScheduledOp> ops;
  const int warmup = g.schedule == "afab" ? m : std::min(g.pp - stage - 1, m);
  int f = 0, b = 0;
  for (; f < warmup; ++f) ops.push_back({'F', f});
  for (; f < m; ++f, ++b) ops.push_back({'F', f}), ops.push_back({'B', b});
  for (; b < m; ++b) ops.push_back({'B', b});
  return ops;
}

}  // namespace

std::string schedule_picture(const Grid& g, const Batch& b, const StepPlan& s) {
  if (g.pp < 2) return "";
  const int m = int(b.micro_batches);
  std::vector<parallel::StageEvents> stages(size_t(g.pp));
  for (int st = 0; st < g.pp; ++st) {
    const StagePlan& sp = s.stages[size_t(st)];
    // One chunk's share of a micro-batch (us): compute, with the stage's tp, p2p
    // and ring time spread in proportion, as micro_batch_s counts them.
    const double us = 1e6 * sp.micro_batch_s / (sp.compute.forward_s + sp.compute.backward_s) / g.virtual_stages;
    const double fwd = us * sp.compute.forward_s, bwd = us * sp.compute.backward_s;
    const std::vector<ScheduledOp> ops = order(g, st, m);
    if (ops.empty()) return "";
    for (const ScheduledOp& op : ops) {
      // The zero-bubble schedules split each backward into B (input gradient) and W (weights'), equal
      // halves (step_time.cpp).
      const bool split = parallel::schedule_splits_backward(g.schedule);
      const double len = op.kind == 'F' ? fwd : split ? bwd / 2 : bwd;
      stages[size_t(st)].push_back({op.kind, op.mb, 0, len, op.chunk});
    }
  }
  const std::vector<parallel::StageEvents> placed =
      parallel::without_transfers(stages, parallel::schedule_chunk_layout(g.schedule));  // a V turns on the last stage
  char title[80], bubble[240];
  const bool v_shape = g.schedule == "zb-v" || g.schedule == "dualpipev";
  std::snprintf(title, sizeof title, "%s, pp %d%s, m %d, as planned",
                g.virtual_stages > 1 && !v_shape ? "interleaved 1f1b" : g.schedule.c_str(), g.pp,
                g.virtual_stages > 1 ? (", v " + std::to_string(g.virtual_stages)).c_str() : "", m);
  std::snprintf(bubble, sizeof bubble, "bubble: %.3f of this drawing idle (the stages as planned, transfers in "
                "their boxes); the planner's formula: %.3f", parallel::measured_bubble_fraction(placed),
                bubble_fraction(g, m));
  return parallel::schedule_svg(placed, title, bubble);
}

}  // namespace loom::plan
