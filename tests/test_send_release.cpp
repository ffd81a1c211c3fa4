// When a table schedule lets go of its sends (parallel/pipeline_parallel/
// send_release.h): at the first op of the sender's order by which the
// receiver, through some chain of messages, is known to have the tensor.
// Checked against an independent replay (schedule_diagram.h's slots, every op
// one slot): the receiving op always starts before the op that waits, so the
// wait never waits on the other rank, and the op before it would not be known
// to (it is the first). An activation is let go of by the B of its micro-batch
// and chunk; an input gradient may outlive its W, the span the memory walk
// (optim/activation_memory.h) counts.
#include <gtest/gtest.h>

#include <ostream>

#include "parallel/pipeline_parallel/dualpipev_schedule.h"
#include "parallel/pipeline_parallel/send_release.h"
#include "parallel/pipeline_parallel/zbv_schedule.h"
#include "parallel/pipeline_parallel/zero_bubble_schedule.h"
#include "parallel/trace/schedule_diagram.h"

namespace loom::parallel {
void PrintTo(const ScheduledOp& o, std::ostream* os) { *os << o.kind << o.mb << "." << o.chunk; }  // "B1.0" in failures
}  // namespace loom::parallel

using namespace loom;
using namespace loom::parallel;

namespace {

using OrderFn = std::vector<ScheduledOp> (*)(int, int, int);
std::vector<ScheduledOp> zb_h1(int p, int r, int m) { return zb_h1_order(p, r, m); }

struct Case {
  const char* name;
  OrderFn order;
  ChunkLayout layout;
};
const Case kCases[] = {{"zb-v", zb_v_order, ChunkLayout::V},
                       {"dualpipev", dualpipev_order, ChunkLayout::V},
                       {"zb-h1", zb_h1, ChunkLayout::Interleaved}};

// Where the tensor an op sends goes, written apart from send_release.cpp:
// the V's chunk 0 and a line go down with F and up with B, the V's chunk 1 the
// other way; the V's last stage turns it in memory.
std::pair<int, int> receiver(const ScheduledOp& o, int s, int p, ChunkLayout layout) {
  if (o.kind == 'W') return {-1, 0};
  int to = o.kind == 'F' ? s + 1 : s - 1;
  if (layout == ChunkLayout::V && o.chunk == 1) to = o.kind == 'F' ? s - 1 : s + 1;
  if (layout == ChunkLayout::V && to == p) return {-1, 0};  // the turn
  return {to >= 0 && to < p ? to : -1, o.chunk};
}

size_t position(const std::vector<ScheduledOp>& order, const ScheduledOp& o) {
  return size_t(std::find(order.begin(), order.end(), o) - order.begin());
}

}  // namespace

TEST(SendRelease, EachSendIsLetGoOfAtTheFirstOpThatKnowsItArrived) {
  int outlive_w = 0;  // gradients still held by their send after their W, over all cases
  for (const Case& k : kCases)
    for (int p = 2; p <= 5; ++p)
      for (int m = 2 * p; m <= 4 * p + 1; m += p - 1) {
        std::vector<std::vector<ScheduledOp>> orders;
        std::vector<StageEvents> stages;
        for (int r = 0; r < p; ++r) {
          orders.push_back(k.order(p, r, m));
          StageEvents evs;
          for (const ScheduledOp& o : orders.back()) evs.push_back({o.kind, o.mb, 0, 0, o.chunk});
          stages.push_back(evs);
        }
        const std::vector<std::vector<int>> slots = schedule_slots(stages, k.layout);
        for (int s = 0; s < p; ++s) {
          const std::vector<int> release = send_release_points(orders, s, k.layout);
          const std::vector<ScheduledOp>& mine = orders[size_t(s)];
          ASSERT_EQ(release.size(), mine.size());
          for (size_t i = 0; i < mine.size(); ++i) {
            const ScheduledOp& o = mine[i];
            const auto [to, chunk] = receiver(o, s, p, k.layout);
            const std::string what = str(k.name, " pp ", p, " m ", m, " stage ", s, " ", o.kind, o.mb, ".", o.chunk);
            if (to < 0) {
              EXPECT_EQ(release[i], -1) << what;
              continue;
            }
            ASSERT_GT(release[i], int(i)) << what;
            const size_t j = position(orders[size_t(to)], {o.kind, o.mb, chunk});
            ASSERT_LT(j, orders[size_t(to)].size()) << what;
            // The receiver started before the wait, in this replay and (known) in every run.
            if (size_t(release[i]) < mine.size()) {
              EXPECT_LT(slots[size_t(to)][j], slots[size_t(s)][size_t(release[i])]) << what;
            }
            if (o.kind == 'F') {  // let go of by its B, whose gradient the receiver sent back
              EXPECT_LE(size_t(release[i]), position(mine, {'B', o.mb, o.chunk})) << what;
            } else {
              outlive_w += size_t(release[i]) > position(mine, {'W', o.mb, o.chunk});
            }
          }
        }
      }
  // Not all gradients are let go of by their W: the memory walk has a term to count.
  EXPECT_GT(outlive_w, 0);
  std::printf("[ measured ] gradients held by their send after their W: %d\n", outlive_w);
}

// The first op that knows: ZB-V pp 2, m 4, stage 0 (chunk 1 is the head,
// whose B sends its input gradient to stage 1). Stage 1 takes B1.1's gradient
// in its B1.1, after its F2.1; the next thing it sends stage 0 is B1.0's
// gradient, which stage 0 reads in its B1.0. Until then stage 0 runs W1.1,
// F3.0, B0.0, W0.0, F2.1 and B2.1 - its peak - with that gradient held by the
// send (the +8 KB stage 0 measured above a formula that freed it in W1.1).
TEST(SendRelease, ZBVStage0HoldsAGradientPastItsW) {
  std::vector<std::vector<ScheduledOp>> orders = {zb_v_order(2, 0, 4), zb_v_order(2, 1, 4)};
  const std::vector<ScheduledOp>& mine = orders[0];
  const std::vector<int> release = send_release_points(orders, 0, ChunkLayout::V);
  const size_t b = position(mine, {'B', 1, 1}), w = position(mine, {'W', 1, 1});
  ASSERT_LT(w, mine.size());
  EXPECT_GT(size_t(release[b]), w);
  EXPECT_EQ(mine[size_t(release[b])], (ScheduledOp{'B', 1, 0}));
}

TEST(SendRelease, RefusesOrdersThatCannotRunTogether) {
  // Stage 1 waits for F1's activation, which stage 0 never sends.
  const std::vector<std::vector<ScheduledOp>> orders = {{{'F', 0, 0}}, {{'F', 0, 0}, {'F', 1, 0}}};
  EXPECT_THROW(send_release_points(orders, 0, ChunkLayout::Interleaved), Error);
}
