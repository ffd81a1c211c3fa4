// DualPipeV's overlapped pairs (parallel/pipeline_parallel/overlapped_pairs.h):
// which pairs of a table run at once, and the worker that runs the F half.
// The runs' numbers - bit-identical to the pairs one half after the other -
// are tests/test_train_gpt_overlapped_pairs.cpp's.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "parallel/pipeline_parallel/dualpipev_schedule.h"
#include "parallel/pipeline_parallel/overlapped_pairs.h"
#include "tensor/grad_mode.h"

using namespace loom;
using namespace loom::parallel;

// Rank r's pairs: step 4's two per round, m - 2p + r + 1 rounds, and step 5's
// F1 + B0W0, p - r - 1 of them (dualpipev_schedule.h). In the V none stalls.
TEST(OverlappedPairs, DualPipeVOverlapsEveryPairOfItsSteadyState) {
  for (int p = 2; p <= 8; ++p)
    for (int m : {2 * p, 2 * p + 3, 4 * p}) {
      std::vector<std::vector<ScheduledOp>> orders;
      for (int r = 0; r < p; ++r) orders.push_back(dualpipev_order(p, r, m));
      for (int r = 0; r < p; ++r) {
        const std::vector<bool> pairs = overlapped_pairs(orders, r, ChunkLayout::V);
        int n = 0;
        for (size_t i = 0; i < pairs.size(); ++i) {
          if (!pairs[i]) continue;
          ++n;
          const ScheduledOp &f = orders[size_t(r)][i], &b = orders[size_t(r)][i + 1], &w = orders[size_t(r)][i + 2];
          EXPECT_EQ(f.kind, 'F');
          EXPECT_EQ(b.kind, 'B');
          EXPECT_EQ(w, (ScheduledOp{'W', b.mb, b.chunk}));
          EXPECT_NE(f.chunk, b.chunk);
        }
        EXPECT_EQ(n, 2 * (m - 2 * p + r + 1) + (p - r - 1)) << "pp " << p << " rank " << r << " m " << m;
      }
    }
}

// Two stages of a line, each chunk its own line: stage 1 runs F0.0 before
// B1.1, so stage 0's B1.1 waits (through stage 1) for stage 0's F0.0. As a
// pair, stage 0 would wait for itself: it runs one half after the other;
// stage 1's pair (its B1.1 receives nothing, the end of the line) still overlaps.
TEST(OverlappedPairs, APairWhoseBackwardWaitsForItsOwnForwardRunsOneHalfAfterTheOther) {
  const std::vector<ScheduledOp> order = {{'F', 0, 0}, {'B', 1, 1}, {'W', 1, 1}};
  const std::vector<std::vector<ScheduledOp>> orders = {order, order};
  EXPECT_EQ(overlapped_pairs(orders, 0, ChunkLayout::Interleaved), (std::vector<bool>{false, false, false}));
  EXPECT_EQ(overlapped_pairs(orders, 1, ChunkLayout::Interleaved), (std::vector<bool>{true, false, false}));
}

// The two halves run at once: each waits to see the other start.
TEST(PairWorker, RunsBothHalvesAtOnceAndRethrows) {
  PairWorker worker;
  std::atomic<int> started{0};
  auto meet = [&] {
    ++started;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (started < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    return started == 2;
  };
  bool there = false, here = false;
  for (int round = 0; round < 3; ++round) {  // the worker lives on across pairs
    started = 0;
    worker.run_both([&] { there = meet(); }, [&] { here = meet(); });
    EXPECT_TRUE(there && here) << "round " << round;
  }
  // The worker runs under the caller's grad mode (thread-local).
  bool worker_grad = true;
  {
    NoGradGuard no_grad;
    worker.run_both([&] { worker_grad = GradMode::is_enabled(); }, [] {});
  }
  EXPECT_FALSE(worker_grad);
  EXPECT_THROW(worker.run_both([] { throw std::runtime_error("F failed"); }, [] {}), std::runtime_error);
  EXPECT_THROW(worker.run_both([] {}, [] { throw std::runtime_error("B failed"); }), std::runtime_error);
  worker.run_both([&] { there = true; }, [] {});  // still serves after an error
  EXPECT_TRUE(there);
}

// With F = B = W one slot on a chunk and free transfers, DualPipeV one half
// after the other takes the V's 6 m + p - 1 slots (its bubble's formula); a
// pair overlapped takes 2 slots instead of 3.
TEST(OverlappedPairs, StepSlotsOneAfterTheOtherAreTheFormulasAndOverlapShortensThem) {
  for (int p : {2, 3, 4})
    for (int m : {2 * p, 2 * p + 3, 16}) {
      std::vector<std::vector<ScheduledOp>> orders;
      for (int r = 0; r < p; ++r) orders.push_back(dualpipev_order(p, r, m));
      const double serial = step_slots(orders, ChunkLayout::V, false);
      const double overlapped = step_slots(orders, ChunkLayout::V, true);
      std::printf("[ slots    ] pp %d m %2d: one after the other %.0f, overlapped %.0f (%.3f)\n", p, m, serial,
                  overlapped, overlapped / serial);
      EXPECT_EQ(serial, 6 * m + p - 1) << "pp " << p << " m " << m;
      // Rank 0 has 2 m - 3 p + 1 pairs (the fewest); no rank can save more slots than its pairs.
      EXPECT_GE(overlapped, 6 * m - (2 * m - 3 * p + 1)) << "pp " << p << " m " << m;
      EXPECT_LT(overlapped, serial) << "pp " << p << " m " << m;
    }
}
