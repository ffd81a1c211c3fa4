// The --print-schedule diagram (parallel/trace/schedule_diagram.h): time slots worked
// out from the executed order alone, on the textbook GPipe and 1F1B orders,
// and the measured bubble on hand-made timestamps.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "parallel/trace/schedule_diagram.h"
#include "parallel/trace/schedule_svg.h"

using namespace loom;
using namespace loom::parallel;

namespace {

// "F0 F1 B0 B1" -> events with unit durations (timestamps unused by the slots).
StageEvents order(const std::string& s) {
  StageEvents out;
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] == 'F' || s[i] == 'B') out.push_back({s[i], s[i + 1] - '0', 0, 0});
  return out;
}

}  // namespace

TEST(ScheduleDiagram, AfabOnTwoStages) {
  // m 3: stage 1 starts a slot late; its backwards follow its forwards at once,
  // stage 0's follow stage 1's one slot later.
  std::vector<StageEvents> stages{order("F0 F1 F2 B0 B1 B2"), order("F0 F1 F2 B0 B1 B2")};
  EXPECT_EQ(schedule_slots(stages), (std::vector<std::vector<int>>{{0, 1, 2, 5, 6, 7}, {1, 2, 3, 4, 5, 6}}));
  EXPECT_EQ(render_schedule(stages, "afab"),
            "afab (F<i>/B<i>: forward/backward of micro-batch i; . idle)\n"
            "stage 0 | F0 F1 F2 .  .  B0 B1 B2\n"
            "stage 1 | .  F0 F1 F2 B0 B1 B2 .\n");
}

TEST(ScheduleDiagram, OneFOneBOnFourStages) {
  // Stage s: 3 - s warm-up forwards, then F/B pairs, then the cool-down backwards (m 4).
  std::vector<StageEvents> stages{order("F0 F1 F2 F3 B0 B1 B2 B3"), order("F0 F1 F2 B0 F3 B1 B2 B3"),
                                  order("F0 F1 B0 F2 B1 F3 B2 B3"), order("F0 B0 F1 B1 F2 B2 F3 B3")};
  // Every stage is busy 2m = 8 of 2(m + p - 1) = 14 slots: the bubble is 3/7 = (p - 1)/(m + p - 1).
  EXPECT_EQ(render_schedule(stages, "1f1b"),
            "1f1b (F<i>/B<i>: forward/backward of micro-batch i; . idle)\n"
            "stage 0 | F0 F1 F2 F3 .  .  .  B0 .  B1 .  B2 .  B3\n"
            "stage 1 | .  F0 F1 F2 .  .  B0 F3 B1 .  B2 .  B3 .\n"
            "stage 2 | .  .  F0 F1 .  B0 F2 B1 F3 B2 .  B3 .  .\n"
            "stage 3 | .  .  .  F0 B0 F1 B1 F2 B2 F3 B3 .  .  .\n");
}

TEST(ScheduleDiagram, AnImpossibleOrderIsAnError) {
  // Stage 0 waits for B0 from stage 1, which waits for F1 that stage 0 never sends first.
  std::vector<StageEvents> stages{order("F0 B0 F1 B1"), order("F1 F0 B0 B1")};
  EXPECT_THAT([&] { schedule_slots(stages); }, ::testing::ThrowsMessage<Error>(::testing::HasSubstr("cannot have run")));
}

TEST(ScheduleDiagram, BubbleFractions) {
  EXPECT_DOUBLE_EQ(theoretical_bubble_fraction(4, 8), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(theoretical_bubble_fraction(1, 8), 0.0);
  // Step from t = 0 to 10: stage 0 busy 0-2 and 6-10 (6 of 10), stage 1 busy 2-6 (4 of 10):
  // bubbles 0.4 and 0.6, mean 0.5.
  std::vector<StageEvents> stages{{{'F', 0, 0, 2}, {'B', 0, 6, 10}}, {{'F', 0, 2, 3}, {'B', 0, 3, 6}}};
  EXPECT_DOUBLE_EQ(measured_bubble_fraction(stages), 0.5);
}

// The picture (schedule_svg.h): one box per event at its measured time, forwards
// blue and backwards green, time scaled so the step spans the row (80 px to 980 px).
TEST(ScheduleSvg, DrawsEveryEventAtItsTime) {
  // Two stages, one micro-batch: F0 on stage 0 [0, 10), F0 on stage 1 [10, 20),
  // B0 on stage 1 [20, 40), B0 on stage 0 [40, 60) microseconds.
  std::vector<loom::parallel::StageEvents> stages = {{{'F', 0, 0, 10}, {'B', 0, 40, 60}},
                                                     {{'F', 0, 10, 20}, {'B', 0, 20, 40}}};
  const std::string svg = loom::parallel::schedule_svg(stages, "1f1b, pp 2, m 1", "bubble: measured 0.500");
  auto count = [&](const std::string& needle) {
    int n = 0;
    for (size_t at = svg.find(needle); at != std::string::npos; at = svg.find(needle, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(count("fill=\"#6fa8dc\""), 2);  // the forwards
  EXPECT_EQ(count("fill=\"#93c47d\""), 2);  // the backwards
  // 900 px for 60 us: stage 1's B0 starts at 80 + 20 x 15 = 380 and is 20 x 15 = 300 wide.
  EXPECT_NE(svg.find("<rect x=\"380.0\" y=\"74.0\" width=\"300.0\""), std::string::npos) << svg;
  EXPECT_NE(svg.find("bubble: measured 0.500"), std::string::npos);
  EXPECT_NE(svg.find(">1f1b, pp 2, m 1<"), std::string::npos);
}
