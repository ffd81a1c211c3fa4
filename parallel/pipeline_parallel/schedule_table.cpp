#include "parallel/pipeline_parallel/schedule_table.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "parallel/pipeline_parallel/overlapped_pairs.h"
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
                                         DataParallel* dp, bool overlap_pairs) {
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

  // An op in its three moments: its input received, computed, its output sent.
  auto receive = [&](size_t i) {
    for (uint64_t ticket : waits[i]) p2p.wait_send(ticket);
    const ScheduledOp& op = order[i];
    if (op.kind == 'F') return stage.chunk_is_first(op.chunk) ? Tensor() : p2p.recv_activation(op.mb, op.chunk);
    if (op.kind == 'B') return stage.chunk_is_last(op.chunk) ? Tensor() : p2p.recv_gradient(op.mb, op.chunk);
    return Tensor();  // W: nothing
  };
  auto compute = [&](size_t i, const Tensor& input) {
    const ScheduledOp& op = order[i];
    if (op.kind == 'F') return run.forward(op.mb, input, op.chunk);
    if (op.kind == 'B') return run.backward_input(op.mb, input, op.chunk);
    run.backward_weight(op.mb, /*sync=*/sync_once ? i == last_w : op.mb + 1 == m, op.chunk);
    return Tensor();
  };
  auto send = [&](size_t i, const Tensor& output) {
    const ScheduledOp& op = order[i];
    if (op.kind == 'F' && !stage.chunk_is_last(op.chunk)) posted(i, p2p.post_activation(output, op.mb, op.chunk));
    if (op.kind == 'B' && !stage.chunk_is_first(op.chunk)) posted(i, p2p.post_gradient(output, op.mb, op.chunk));
  };

  const std::vector<bool> pairs = overlap_pairs ? overlapped_pairs(orders, p2p.pp_rank(), layout)
                                                : std::vector<bool>(order.size(), false);
  std::optional<PairWorker> worker;  // the pairs' second thread (overlapped_pairs.h)
  for (size_t i = 0; i < order.size(); ++i) {
    if (!pairs[i]) {
      send(i, compute(i, receive(i)));
      continue;
    }
    // DualPipe's pair: both receives, F || B then W, both sends.
    const Tensor f_in = receive(i), b_in = receive(i + 1);
    receive(i + 2);
    Tensor f_out, b_out;
    if (!worker) worker.emplace();
    worker->run_both([&] { f_out = compute(i, f_in); },
                     [&] {
                       b_out = compute(i + 1, b_in);
                       compute(i + 2, Tensor());
                     });
    // A send is let go of at an op after the pair: none of its own ops knows it delivered (overlapped_pairs.h).
    LOOM_CHECK(release[i] < 0 || release[i] > int(i) + 2, "schedule table: a pair's F is known delivered inside it");
    send(i, f_out);
    send(i + 1, b_out);
    i += 2;
  }
  ForwardBackwardResult result = run.finish();
  // A pair's halves end in either order: --print-schedule lists the table's (F, then B, W).
  if (overlap_pairs) {
    std::map<std::tuple<char, int, int>, size_t> position;
    for (size_t i = 0; i < order.size(); ++i) position[{order[i].kind, order[i].mb, order[i].chunk}] = i;
    std::stable_sort(result.events.begin(), result.events.end(), [&](const ScheduleEvent& a, const ScheduleEvent& b) {
      return position[{a.kind, a.mb, a.chunk}] < position[{b.kind, b.mb, b.chunk}];
    });
  }
  return result;
}

}  // namespace loom::parallel
