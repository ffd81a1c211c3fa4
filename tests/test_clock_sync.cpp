// The clock-offset estimate of a multi-host trace (parallel/trace/clock_sync.h):
// the ping-pong with the shortest round trip decides, offset = the midpoint's
// difference, error = half that round trip. Across hosts it runs in
// tests/multihost (Multihost.TraceFromTwoHostsIsOnRankZerosClock).
#include <gtest/gtest.h>

#include "parallel/trace/clock_sync.h"
#include "tensor/error.h"

using namespace loom;
using namespace loom::parallel::trace;

// Rank 0's clock runs 1000 us ahead of this one. Legs of 30 and 10 us: rank 0
// answers at 1000 + 30 (by this clock 30), the reply lands at 40; the midpoint
// 20 says 1010, off by (30 - 10) / 2 = 10 us, within the error of 20.
TEST(ClockSync, ShortestRoundTripGivesTheOffsetAndHalfItAsTheError) {
  std::vector<PingPong> samples = {
      {0, 1030, 40},        // round trip 40 us
      {100, 1300, 400},     // 300 us: a leg delayed (the other process was descheduled)
      {500, 1500 + 5, 510}, // 10 us, symmetric: exact
  };
  ClockOffset c = best_offset(samples);
  EXPECT_DOUBLE_EQ(c.offset_us, 1000);
  EXPECT_DOUBLE_EQ(c.error_us, 5);
  samples.pop_back();
  c = best_offset(samples);
  EXPECT_DOUBLE_EQ(c.offset_us, 1010);
  EXPECT_DOUBLE_EQ(c.error_us, 20);
  EXPECT_LE(std::abs(c.offset_us - 1000), c.error_us);
}

TEST(ClockSync, NoSamplesIsAnError) { EXPECT_THROW(best_offset({}), Error); }
