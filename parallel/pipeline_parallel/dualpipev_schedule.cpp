#include "parallel/pipeline_parallel/dualpipev_schedule.h"

#include <deque>

#include "parallel/pipeline_parallel/schedule_table.h"

namespace loom::parallel {

std::vector<ScheduledOp> dualpipev_order(int p, int r, int m) {
  LOOM_CHECK(p >= 2 && r >= 0 && r < p, "dualpipev_order: pp rank ", r, " of ", p, " (DualPipeV needs pp >= 2)");
  LOOM_CHECK(m >= 2 * p, "dualpipev: ", m, " micro-batches for pp ", p, "; DualPipeV needs at least 2 pp = ", 2 * p,
             " (as many as virtual stages)");
  int f[2] = {0, 0}, b[2] = {0, 0};  // the next micro-batch to run forward / backward, per chunk
  std::deque<ScheduledOp> weights;   // the W's the split B's left, oldest first
  std::vector<ScheduledOp> order;
  auto F = [&](int c) { order.push_back({'F', f[c]++, c}); };
  auto B_split = [&](int c) {  // B now, its W queued
    order.push_back({'B', b[c], c});
    weights.push_back({'W', b[c]++, c});
  };
  auto B_full = [&](int c) {
    order.push_back({'B', b[c], c});
    order.push_back({'W', b[c]++, c});
  };
  auto W_queued = [&] {
    if (weights.empty()) return;
    order.push_back(weights.front());
    weights.pop_front();
  };

  for (int i = 0; i < 2 * (p - r - 1); ++i) F(0);                  // 1
  for (int i = 0; i < r + 1; ++i) F(0), F(1);                      // 2
  for (int i = 0; i < p - r - 1; ++i) B_split(1), W_queued(), F(1);  // 3
  for (int i = 0; i < m - 2 * p + r + 1; ++i) {                    // 4: the overlapped pairs
    F(0), B_full(1);
    F(1), B_full(0);
  }
  for (int i = 0; i < p - r - 1; ++i) B_full(1), F(1), B_full(0);  // 5
  const int step6 = r + 1;                                         // 6: full, then split from half-way
  bool split = false;
  for (int i = 0; i < step6; ++i) {
    if (i == step6 / 2 && r % 2 == 1) split = true;
    split ? B_split(1) : B_full(1);
    if (i == step6 / 2 && r % 2 == 0) split = true;
    split ? B_split(0) : B_full(0);
  }
  for (int i = 0; i < p - r - 1; ++i) {                            // 7
    W_queued();
    split ? B_split(0) : B_full(0);
  }
  for (int i = 0; i < r + 1; ++i) W_queued();                      // 8
  return order;
}

ForwardBackwardResult train_step_pipeline_dualpipev(ModelChunks& stage, PipelineP2P& p2p,
                                                    const std::vector<MicroBatch>& micro_batches,
                                                    const LossFn& loss_fn, DataParallel* dp, bool overlap_pairs) {
  LOOM_CHECK(stage.num_chunks() == 2, "dualpipev: a rank holds two chunks in a V, this one ", stage.num_chunks());
  const int m = int(micro_batches.size());
  std::vector<std::vector<ScheduledOp>> orders;
  for (int r = 0; r < p2p.pp_size(); ++r) orders.push_back(dualpipev_order(p2p.pp_size(), r, m));
  return run_schedule_table(orders, ChunkLayout::V, stage, p2p, micro_batches, loss_fn, dp, overlap_pairs);
}

}  // namespace loom::parallel
