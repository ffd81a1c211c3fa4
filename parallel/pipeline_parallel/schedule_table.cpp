#include "parallel/pipeline_parallel/schedule_table.h"

#include <set>
#include <tuple>

#include "parallel/pipeline_parallel/send_release.h"

namespace loom::parallel {

namespace {

void check_table(const std::vector<ScheduledOp>& order, int m, int chunks) {
  std::set<std::tuple<char, int, int>> seen;
  for (const ScheduledOp& op : order)
    LOOM_CHECK(op.mb >= 0 && op.mb < m && op.chunk >= 0 && op.chunk < chunks &&
                   seen.insert({op.kind, op.mb, op.chunk}).second,
               "schedule table: ", op.kind, op.mb, ".", op.chunk, " is outside ", m, " micro-batches x ", chunks,
               " chunks, or listed twice");
  LOOM_CHECK(seen.size() == size_t(3 * m * chunks), "schedule table: ", seen.size(), " operations for ", m,
             " micro-batches x ", chunks, " chunks; every pair needs its F, B and W");
}

}  // namespace

ForwardBackwardResult run_schedule_table(const std::vector<std::vector<ScheduledOp>>& orders, ChunkLayout layout,
                                         ModelChunks& stage, PipelineP2P& p2p,
                                         const std::vector<MicroBatch>& micro_batches, const LossFn& loss_fn,
                                         DataParallel* dp) {
  MicroBatchRunner run(stage, &p2p, micro_batches, loss_fn, dp);
  const int m = run.num_microbatches();
  LOOM_CHECK(orders.size() == size_t(p2p.pp_size()), "schedule table: ", orders.size(), " orders for pp ",
             p2p.pp_size());
  const std::vector<ScheduledOp>& order = orders[size_t(p2p.pp_rank())];
  check_table(order, m, stage.num_chunks());
  // Each send is waited for at the op by which it is known delivered (send_release.h): waits[i] at op i's start.
  const std::vector<int> release = send_release_points(orders, p2p.pp_rank(), layout);
  std::vector<std::vector<uint64_t>> waits(order.size() + 1);  // [size]: end_schedule's
  auto posted = [&](size_t i, uint64_t ticket) {
    if (!ticket) return;  // the V's turn: in memory
    LOOM_CHECK(release[i] >= 0, "schedule table: stage ", p2p.pp_rank(), " sent ", order[i].kind, order[i].mb, ".",
               order[i].chunk, "'s tensor over a link send_release.h does not know");
    waits[size_t(release[i])].push_back(ticket);
  };
  size_t last_w = 0;  // the rank's last W: where a once-per-step dp sync goes
  for (size_t i = 0; i < order.size(); ++i)
    if (order[i].kind == 'W') last_w = i;
  const bool sync_once = dp && dp->syncs_once_per_step();

  for (size_t i = 0; i < order.size(); ++i) {
    const ScheduledOp& op = order[i];
    const int mb = op.mb, c = op.chunk;
    for (uint64_t ticket : waits[i]) p2p.wait_send(ticket);
    if (op.kind == 'F') {
      Tensor input = stage.chunk_is_first(c) ? Tensor() : p2p.recv_activation(mb, c);
      Tensor output = run.forward(mb, input, c);
      if (!stage.chunk_is_last(c)) posted(i, p2p.post_activation(output, mb, c));
    } else if (op.kind == 'B') {
      Tensor output_grad = stage.chunk_is_last(c) ? Tensor() : p2p.recv_gradient(mb, c);
      Tensor input_grad = run.backward_input(mb, output_grad, c);
      if (!stage.chunk_is_first(c)) posted(i, p2p.post_gradient(input_grad, mb, c));
    } else {
      run.backward_weight(mb, /*sync=*/sync_once ? i == last_w : mb + 1 == m, c);
    }
  }
  return run.finish();
}

}  // namespace loom::parallel
