#include "parallel/pipeline_parallel/zbv_schedule.h"

#include <algorithm>

#include "parallel/pipeline_parallel/schedule_table.h"

namespace loom::parallel {

std::vector<ScheduledOp> zb_v_order(int p, int r, int m) {
  LOOM_CHECK(p >= 2 && r >= 0 && r < p && m >= 1, "zb_v_order: pp rank ", r, " of ", p, " with ", m,
             " micro-batches (ZB-V needs pp >= 2)");
  const int n = std::max(m, 2 * p - 1);  // enough micro-batches to fill the V
  int f[2] = {0, 0}, b[2] = {0, 0}, w[2] = {0, 0};  // the next micro-batch of each kind, per chunk
  std::vector<ScheduledOp> order;
  auto F = [&](int c) { order.push_back({'F', f[c]++, c}); };
  auto B = [&](int c) { order.push_back({'B', b[c]++, c}); };
  auto W = [&](int c) { order.push_back({'W', w[c]++, c}); };

  for (int i = 0; i < 2 * (p - r) - 1; ++i) F(0);        // warm-up: down the V
  for (int i = 0; i < r; ++i) F(1), F(0);
  for (int i = 0; i < p - r; ++i) F(1), B(1), W(1);      // the turn's first backwards
  while (f[1] < f[0] || f[0] < n) {                      // steady: chunk 0's triple, then chunk 1's
    if (f[0] < n) F(0);
    B(0), W(0), F(1), B(1), W(1);
  }
  for (int i = 0; i < r; ++i) B(0), B(1);                // cool-down: the B's first, the W's fill in after
  for (int i = 0; i < p - r; ++i) B(0), W(0);
  while (w[1] < b[1]) W(1);
  while (w[0] < b[0]) W(0);

  std::erase_if(order, [m](const ScheduledOp& op) { return op.mb >= m; });  // the V's filler micro-batches
  return order;
}

ForwardBackwardResult train_step_pipeline_zb_v(ModelChunks& stage, PipelineP2P& p2p,
                                               const std::vector<MicroBatch>& micro_batches, const LossFn& loss_fn,
                                               DataParallel* dp) {
  LOOM_CHECK(stage.num_chunks() == 2, "zb-v: a rank holds two chunks in a V, this one ", stage.num_chunks());
  const int m = int(micro_batches.size());
  std::vector<std::vector<ScheduledOp>> orders;
  for (int r = 0; r < p2p.pp_size(); ++r) orders.push_back(zb_v_order(p2p.pp_size(), r, m));
  return run_schedule_table(orders, ChunkLayout::V, stage, p2p, micro_batches, loss_fn, dp);
}

}  // namespace loom::parallel
