// Interleaved 1F1B's order (parallel/pipeline_parallel/interleaved_schedule.h)
// against lists worked out by hand from Megatron-LM's
// forward_backward_pipelining_with_interleaving: warm-up
// min((p - r - 1) 2 + (v - 1) p, m v) forwards (all m v when m = p), then
// forward k + warm-up / backward k pairs, then the remaining backwards; the
// k-th forward on chunk (k mod p v) / p of micro-batch (k / p v) p + k mod p,
// the k-th backward on the chunks in reverse.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

#include "parallel/pipeline_parallel/interleaved_schedule.h"
#include "parallel/trace/schedule_diagram.h"

using namespace loom;
using namespace loom::parallel;

namespace {

// "F0.0 F1.0 B0.1" -> ops.
std::vector<ScheduledOp> ops_of(const std::string& s) {
  std::vector<ScheduledOp> out;
  std::stringstream in(s);
  for (std::string w; in >> w;) {
    const size_t dot = w.find('.');
    out.push_back({w[0], std::stoi(w.substr(1, dot - 1)), std::stoi(w.substr(dot + 1))});
  }
  return out;
}

StageEvents events_of(const std::vector<ScheduledOp>& ops) {
  StageEvents out;
  for (const ScheduledOp& o : ops) out.push_back({o.kind, o.mb, 0, 0, o.chunk});
  return out;
}

}  // namespace

TEST(InterleavedOrder, TwoStagesTwoChunksFourMicroBatches) {
  // Forwards: F0.0 F1.0 F0.1 F1.1 | F2.0 F3.0 F2.1 F3.1; backwards: B0.1 B1.1 B0.0 B1.0 | B2.1 B3.1 B2.0 B3.0.
  // Rank 0: warm-up (2 - 0 - 1) 2 + (2 - 1) 2 = 4; rank 1: 0 + 2 = 2.
  EXPECT_EQ(interleaved_order(2, 0, 2, 4),
            ops_of("F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0"));
  EXPECT_EQ(interleaved_order(2, 1, 2, 4),
            ops_of("F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0"));
}

TEST(InterleavedOrder, AsManyMicroBatchesAsStagesRunsEveryForwardFirst) {
  // m = p: Megatron's all_warmup_microbatches, on every rank.
  for (int rank : {0, 1})
    EXPECT_EQ(interleaved_order(2, rank, 2, 2), ops_of("F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0")) << rank;
}

TEST(InterleavedOrder, FourStagesTwoChunksEightMicroBatches) {
  // Rank 0: warm-up 3 x 2 + 4 = 10; rank 3: 0 + 4 = 4 (of m v = 16).
  EXPECT_EQ(interleaved_order(4, 0, 2, 8),
            ops_of("F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 F4.0 F5.0 "
                   "F6.0 B0.1 F7.0 B1.1 F4.1 B2.1 F5.1 B3.1 F6.1 B0.0 F7.1 B1.0 "
                   "B2.0 B3.0 B4.1 B5.1 B6.1 B7.1 B4.0 B5.0 B6.0 B7.0"));
  EXPECT_EQ(interleaved_order(4, 3, 2, 8),
            ops_of("F0.0 F1.0 F2.0 F3.0 "
                   "F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.1 B3.1 F4.0 B0.0 F5.0 B1.0 F6.0 B2.0 F7.0 B3.0 "
                   "F4.1 B4.1 F5.1 B5.1 F6.1 B6.1 F7.1 B7.1 "
                   "B4.0 B5.0 B6.0 B7.0"));
}

TEST(InterleavedOrder, MicroBatchesMustBeAMultipleOfTheStages) {
  EXPECT_THAT([] { interleaved_order(4, 0, 2, 6); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr("6 micro-batches are not a multiple of pp 4")));
  EXPECT_THAT([] { interleaved_order(1, 0, 2, 4); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr("needs pp >= 2")));
}

TEST(InterleavedOrder, EveryRanksOrderCanRunAroundTheRing) {
  // schedule_slots follows each forward to the next virtual stage (rank p - 1's
  // chunk c feeds rank 0's chunk c + 1) and throws on an order that would wait forever.
  for (auto [p, v, m] : {std::tuple{2, 2, 4}, {2, 3, 6}, {4, 2, 8}, {4, 3, 4}, {3, 2, 9}}) {
    std::vector<StageEvents> stages;
    for (int r = 0; r < p; ++r) stages.push_back(events_of(interleaved_order(p, r, v, m)));
    EXPECT_NO_THROW(schedule_slots(stages)) << "pp " << p << " v " << v << " m " << m;
  }
}

TEST(InterleavedOrder, DiagramShowsChunksAndTheRingsDependencies) {
  // pp 2, v 2, m 2, worked out by hand: rank 0's F0.1 waits for rank 1's F0.0,
  // rank 1's B0.0 for rank 0's B0.1.
  std::vector<StageEvents> stages{events_of(interleaved_order(2, 0, 2, 2)), events_of(interleaved_order(2, 1, 2, 2))};
  EXPECT_EQ(render_schedule(stages, "interleaved"),
            "interleaved (F<i>.<c>/B<i>.<c>: forward/backward of micro-batch i on chunk c; . idle)\n"
            "stage 0 | F0.0 F1.0 F0.1 F1.1 .    .    B0.1 B1.1 B0.0 B1.0\n"
            "stage 1 | .    F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0 .\n");
  EXPECT_DOUBLE_EQ(theoretical_bubble_fraction(2, 2, 2), 1.0 / 5.0);  // (p - 1)/(v m + p - 1)
}
