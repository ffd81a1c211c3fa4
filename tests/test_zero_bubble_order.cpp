// The zero-bubble schedules' orders (parallel/pipeline_parallel/zero_bubble_schedule.h)
// as the paper draws them, and the two numbers each is for: the bubble, with
// F, B and W one slot each (Qi et al. 2024's T_F = T_B = T_W), and the
// micro-batches a stage holds (from F to W), against 1F1B's.
#include <gtest/gtest.h>

#include <algorithm>

#include "parallel/pipeline_parallel/zero_bubble_schedule.h"
#include "parallel/trace/schedule_diagram.h"

using namespace loom;
using namespace loom::parallel;

namespace {

StageEvents events_of(const std::vector<ScheduledOp>& ops) {
  StageEvents out;
  for (const ScheduledOp& o : ops) out.push_back({o.kind, o.mb, 0, 0, o.chunk});
  return out;
}

std::vector<StageEvents> zb_h1(int p, int m) {
  std::vector<StageEvents> stages;
  for (int r = 0; r < p; ++r) stages.push_back(events_of(zb_h1_order(p, r, m)));
  return stages;
}

// Idle slots over all slots, averaged over stages, every op one slot.
double slot_bubble(const std::vector<StageEvents>& stages) {
  const std::vector<std::vector<int>> slots = schedule_slots(stages);
  int span = 0;
  for (const auto& s : slots) span = std::max(span, s.back() + 1);
  double idle = 0;
  for (const auto& s : slots) idle += double(span - int(s.size())) / span;
  return idle / double(slots.size());
}

// The most micro-batches a stage holds at once: F done, its last backward piece not yet.
int most_in_flight(const StageEvents& ops, char last_piece) {
  int now = 0, most = 0;
  for (const ScheduleEvent& e : ops) {
    if (e.kind == 'F') most = std::max(most, ++now);
    if (e.kind == last_piece) --now;
  }
  return most;
}

}  // namespace

TEST(ZeroBubbleOrder, ZBH1IsThePapersTable) {
  const std::string table = render_schedule(zb_h1(4, 6), "zb-h1, pp 4, m 6");
  EXPECT_EQ(table,
            "zb-h1, pp 4, m 6 (F<i>/B<i>/W<i>: forward/input gradient/weight gradient of micro-batch i; . idle)\n"
            "stage 0 | F0 F1 F2 F3 .  .  .  B0 W0 F4 B1 W1 F5 B2 W2 B3 W3 B4 W4 B5 W5\n"
            "stage 1 | .  F0 F1 F2 .  .  B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 B4 W3 B5 W4 W5\n"
            "stage 2 | .  .  F0 F1 .  B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 B5 W3 W4 W5\n"
            "stage 3 | .  .  .  F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 W3 W4 W5\n")
      << table;
}

// (p - 1)(F + B - W) idle per stage against 1F1B's (p - 1)(F + B + W): with
// equal F, B, W the bubble is (p - 1) / (3 m + p - 1), a third of 1F1B's in time.
TEST(ZeroBubbleOrder, ZBH1sBubbleIsAThirdOf1F1Bs) {
  for (auto [p, m] : {std::pair{2, 4}, {3, 6}, {4, 8}, {4, 16}}) {
    const double got = slot_bubble(zb_h1(p, m));
    EXPECT_NEAR(got, double(p - 1) / double(3 * m + p - 1), 1e-12) << "pp " << p << " m " << m;
  }
}

// Stage r holds up to p micro-batches (1F1B: p - r), so the peak over
// stages is 1F1B's: stage 0's p.
TEST(ZeroBubbleOrder, ZBH1HoldsAtMost1F1BsPeakOnEveryStage) {
  for (auto [p, m] : {std::pair{2, 4}, {4, 8}, {4, 2}, {3, 7}})
    for (int r = 0; r < p; ++r)
      EXPECT_EQ(most_in_flight(events_of(zb_h1_order(p, r, m)), 'W'), std::min(p, m)) << "pp " << p << " rank " << r;
}

TEST(ZeroBubbleOrder, ZBH1RunsEveryMicroBatchsFBAndWOnceInThatOrder) {
  for (auto [p, m] : {std::pair{2, 1}, {3, 2}, {4, 5}})
    for (int r = 0; r < p; ++r) {
      std::vector<ScheduledOp> order = zb_h1_order(p, r, m);
      EXPECT_EQ(order.size(), size_t(3 * m));
      for (int mb = 0; mb < m; ++mb) {
        auto at = [&](char k) { return std::find(order.begin(), order.end(), ScheduledOp{k, mb, 0}) - order.begin(); };
        EXPECT_LT(at('F'), at('B'));
        EXPECT_LT(at('B'), at('W'));
      }
    }
}
