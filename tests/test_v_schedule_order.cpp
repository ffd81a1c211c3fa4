// The V schedules' orders (parallel/pipeline_parallel/zbv_schedule.h,
// dualpipev_schedule.h): every (micro-batch, chunk) runs its F, B and W once,
// in that order; the orders of all ranks can run together around the V (the
// slot replay of schedule_diagram.h, the turn on the last stage); and the two
// numbers each is for, with F, B and W one slot each on a chunk: the bubble,
// (p - 1)/(6 m + p - 1) - half of ZB-H1's in stage time - and the chunk-micro-
// batches a rank holds (from F to W): 2p for ZB-V (1F1B's first stage's p
// micro-batches, on every rank), 2p + 1 for DualPipeV.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>

#include "parallel/pipeline_parallel/dualpipev_schedule.h"
#include "parallel/pipeline_parallel/zbv_schedule.h"
#include "parallel/pipeline_parallel/zero_bubble_schedule.h"
#include "parallel/trace/schedule_diagram.h"

using namespace loom;
using namespace loom::parallel;

namespace {

using OrderFn = std::function<std::vector<ScheduledOp>(int, int, int)>;

std::vector<StageEvents> stages_of(const OrderFn& order, int p, int m) {
  std::vector<StageEvents> stages;
  for (int r = 0; r < p; ++r) {
    StageEvents evs;
    for (const ScheduledOp& o : order(p, r, m)) evs.push_back({o.kind, o.mb, 0, 0, o.chunk});
    stages.push_back(evs);
  }
  return stages;
}

// Idle slots over all slots, averaged over stages, every op one slot.
double slot_bubble(const std::vector<StageEvents>& stages, ChunkLayout layout) {
  const std::vector<std::vector<int>> slots = schedule_slots(stages, layout);
  int span = 0;
  for (const auto& s : slots) span = std::max(span, s.back() + 1);
  double idle = 0;
  for (const auto& s : slots) idle += double(span - int(s.size())) / span;
  return idle / double(slots.size());
}

// The most chunk-micro-batches held at once: F done, W not yet.
int most_in_flight(const std::vector<ScheduledOp>& ops) {
  int now = 0, most = 0;
  for (const ScheduledOp& o : ops) {
    if (o.kind == 'F') most = std::max(most, ++now);
    if (o.kind == 'W') --now;
  }
  return most;
}

const OrderFn kZbV = zb_v_order, kDualPipeV = dualpipev_order;

}  // namespace

TEST(VScheduleOrder, EveryMicroBatchRunsFBAndWOnceOnEachChunkInThatOrder) {
  for (auto [p, m] : {std::pair{2, 1}, {2, 4}, {3, 2}, {3, 6}, {4, 5}, {4, 8}, {4, 13}})
    for (const auto& [name, order] : {std::pair{"zb-v", kZbV}, {"dualpipev", kDualPipeV}}) {
      if (std::string(name) == "dualpipev" && m < 2 * p) continue;  // refused (below)
      for (int r = 0; r < p; ++r) {
        const std::vector<ScheduledOp> ops = order(p, r, m);
        EXPECT_EQ(ops.size(), size_t(6 * m)) << name << " pp " << p << " rank " << r << " m " << m;
        for (int c = 0; c < 2; ++c)
          for (int mb = 0; mb < m; ++mb) {
            auto at = [&](char k) { return std::count(ops.begin(), ops.end(), ScheduledOp{k, mb, c}) == 1
                                               ? std::find(ops.begin(), ops.end(), ScheduledOp{k, mb, c}) - ops.begin()
                                               : -1; };
            EXPECT_GE(at('F'), 0) << name << " F" << mb << "." << c;
            EXPECT_LT(at('F'), at('B')) << name << " pp " << p << " rank " << r << " mb " << mb << " chunk " << c;
            EXPECT_LT(at('B'), at('W')) << name << " pp " << p << " rank " << r << " mb " << mb << " chunk " << c;
          }
      }
      // Around the V every receive meets its send: the replay places every op.
      EXPECT_NO_THROW(schedule_slots(stages_of(order, p, m), ChunkLayout::V)) << name << " pp " << p << " m " << m;
    }
}

// Rank r starts r slots late and the V drains as it filled: p - 1 idle chunk
// slots per rank against 6 m busy, half of ZB-H1's (p - 1) stage-F's.
TEST(VScheduleOrder, BubbleIsPMinusOneChunkSlotsHalfOfZBH1s) {
  for (auto [p, m] : {std::pair{2, 4}, {3, 6}, {4, 8}, {4, 16}, {3, 13}}) {
    const OrderFn zb_h1 = [](int pp, int r, int mbs) { return zb_h1_order(pp, r, mbs); };
    const double want = double(p - 1) / double(6 * m + p - 1);
    EXPECT_NEAR(slot_bubble(stages_of(kZbV, p, m), ChunkLayout::V), want, 1e-12) << "zb-v pp " << p << " m " << m;
    EXPECT_NEAR(slot_bubble(stages_of(kDualPipeV, p, m), ChunkLayout::V), want, 1e-12) << "dualpipev pp " << p;
    EXPECT_NEAR(slot_bubble(stages_of(zb_h1, p, m), ChunkLayout::Interleaved), double(p - 1) / double(3 * m + p - 1), 1e-12) << "zb-h1 pp " << p << " m " << m;
  }
}

// Transfers that take time (schedule_diagram.h's with_transfer_latency): every
// op one slot, every transfer between ranks half a slot. Each order then
// exposes some of them: at least the first micro-batch's 2(p - 1) on its way
// down and back up the V, which stage 0 can only fill with its forwards.
// DualPipeV's pairs (F on one chunk, B and W of another) give more transfers
// a slot of other work to hide behind than ZB-V's triples.
TEST(VScheduleOrder, DualPipeVExposesFewerTransfersThanZBV) {
  auto span = [](const std::vector<StageEvents>& stages, double latency) {
    std::vector<StageEvents> unit = stages;
    for (StageEvents& evs : unit)
      for (ScheduleEvent& e : evs) e.start_us = 0, e.end_us = 1;
    double end = 0;
    for (const StageEvents& evs : with_transfer_latency(unit, latency, ChunkLayout::V))
      for (const ScheduleEvent& e : evs) end = std::max(end, e.end_us);
    return end;
  };
  for (auto [p, m] : {std::pair{2, 8}, {3, 6}, {3, 12}, {4, 8}, {4, 16}}) {
    const double zbv = span(stages_of(kZbV, p, m), 0.5), dpv = span(stages_of(kDualPipeV, p, m), 0.5);
    const double slots = 6 * m + p - 1;  // the step with instant transfers
    EXPECT_DOUBLE_EQ(span(stages_of(kZbV, p, m), 0), slots) << "pp " << p << " m " << m;
    EXPECT_GE(zbv - slots, 2 * (p - 1) * 0.5) << "zb-v pp " << p << " m " << m;
    EXPECT_GE(dpv - slots, 2 * (p - 1) * 0.5) << "dualpipev pp " << p << " m " << m;
    EXPECT_LT(dpv, zbv) << "pp " << p << " m " << m;
    std::printf("[ measured ] pp %d m %d: transfers exposed, zb-v %.0f, dualpipev %.0f\n", p, m, (zbv - slots) / 0.5,
                (dpv - slots) / 0.5);
  }
}

TEST(VScheduleOrder, ZBVHoldsTwoPChunkMicroBatchesAndDualPipeVOneMore) {
  for (auto [p, m] : {std::pair{2, 4}, {3, 6}, {4, 8}, {4, 32}, {3, 5}})
    for (int r = 0; r < p; ++r) {
      EXPECT_EQ(most_in_flight(zb_v_order(p, r, m)), 2 * p) << "zb-v pp " << p << " rank " << r << " m " << m;
      if (m >= 2 * p) {
        EXPECT_EQ(most_in_flight(dualpipev_order(p, r, m)), 2 * p + 1) << "dualpipev pp " << p << " rank " << r;
      }
    }
}

// The turn: stage p - 1 runs chunk 1's F right after chunk 0's for the first
// micro-batch, and chunk 0's B waits for chunk 1's on the same stage.
TEST(VScheduleOrder, TheLastStageTurnsTheV) {
  const std::vector<ScheduledOp> last = zb_v_order(3, 2, 6);
  EXPECT_EQ((std::vector<ScheduledOp>(last.begin(), last.begin() + 3)),
            (std::vector<ScheduledOp>{{'F', 0, 0}, {'F', 0, 1}, {'F', 1, 0}}));
  EXPECT_THROW(schedule_slots(stages_of(kZbV, 3, 6), ChunkLayout::Interleaved), Error);  // not a ring
}

TEST(VScheduleOrder, RefusesWhatItCannotOrder) {
  EXPECT_THROW(zb_v_order(1, 0, 4), Error);
  EXPECT_THROW(zb_v_order(2, 2, 4), Error);
  EXPECT_THROW(dualpipev_order(2, 0, 3), Error);  // fewer micro-batches than virtual stages
}
