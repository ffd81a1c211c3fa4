#include "parallel/pipeline_parallel/zero_bubble_schedule.h"

#include <algorithm>

#include "parallel/pipeline_parallel/send_release.h"
#include "parallel/teach/teach_break.h"

namespace loom::parallel {

std::vector<ScheduledOp> zb_h1_order(int p, int rank, int m) {
  LOOM_CHECK(p >= 1 && rank >= 0 && rank < p && m >= 1, "zb_h1_order: pp rank ", rank, " of ", p, " with ", m,
             " micro-batches");
  std::vector<ScheduledOp> order;
  const int warmup = std::min(p - rank - 1, m);  // 1F1B's
  int w = 0;                                     // the next micro-batch whose W runs
  for (int f = 0; f < warmup; ++f) order.push_back({'F', f});
  for (int b = 0; b < m; ++b) {
    if (warmup + b < m) order.push_back({'F', warmup + b});  // steady: one forward, one B (cool-down: B alone)
    order.push_back({'B', b});
    if (b >= rank) order.push_back({'W', w++});  // the first `rank` W's wait
  }
  for (; w < m; ++w) order.push_back({'W', w});
  return order;
}

ForwardBackwardResult train_step_pipeline_zb_h1(ModelChunks& stage, PipelineP2P& p2p,
                                                const std::vector<MicroBatch>& micro_batches, const LossFn& loss_fn,
                                                DataParallel* dp) {
  MicroBatchRunner run(stage, &p2p, micro_batches, loss_fn, dp);
  const int m = run.num_microbatches(), p = p2p.pp_size();
  std::vector<std::vector<ScheduledOp>> orders;
  for (int r = 0; r < p; ++r) orders.push_back(zb_h1_order(p, r, m));
  const std::vector<ScheduledOp>& order = orders[size_t(p2p.pp_rank())];
  // Sends do not wait for their receivers (pipeline_channels.h), so each stage
  // simply receives right before the F or B that needs it; each send is let go
  // of at the first op that knows it arrived (send_release.h), as in the V.
  const std::vector<int> release = send_release_points(orders, p2p.pp_rank(), ChunkLayout::Interleaved);
  std::vector<std::vector<uint64_t>> waits(order.size() + 1);  // [size]: end_schedule's
  for (size_t i = 0; i < order.size(); ++i) {
    const auto [kind, mb, chunk] = order[i];
    for (uint64_t ticket : waits[i]) p2p.wait_send(ticket);
    uint64_t sent = 0;
    if (kind == 'F') sent = p2p.post_forward(run.forward(mb, p2p.recv_forward(mb)), mb);
    else if (kind == 'B') sent = p2p.post_backward(run.backward_input(mb, p2p.recv_backward(mb)), mb);
    else if (teach::broken(teach::Break::ZbSyncAtB)) run.backward_weight(mb, /*sync=*/false);  // --teach-break zb-sync-at-b: the sync went to B, where no hook fires
    else run.backward_weight(mb, /*sync=*/mb + 1 == m);
    if (sent) waits[size_t(release[i])].push_back(sent);
  }
  return run.finish();
}

}  // namespace loom::parallel
