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
  // The busiest stage, stage 0 (6 of 10): 0.4, the paper's bubble rate.
  EXPECT_DOUBLE_EQ(busiest_stage_bubble_fraction(stages), 0.4);
}

// Transfers taken out: stage 1's F0 waited 5 us for the activation and stage
// 0's B0 5 us for the gradient. Replayed back to back the step is 60 us, not
// 70, and with equal stages the bubble is the formula's (p - 1)/(m + p - 1) = 1/2.
TEST(ScheduleDiagram, WithoutTransfersTheSameSpansRunBackToBack) {
  std::vector<StageEvents> stages{{{'F', 0, 0, 10}, {'B', 0, 50, 70}}, {{'F', 0, 15, 25}, {'B', 0, 25, 45}}};
  EXPECT_DOUBLE_EQ(measured_bubble_fraction(stages), 40.0 / 70.0);
  const std::vector<StageEvents> r = without_transfers(stages);
  EXPECT_DOUBLE_EQ(r[1][0].start_us, 10);  // F0 on stage 1 right after F0 on stage 0
  EXPECT_DOUBLE_EQ(r[1][1].end_us, 40);
  EXPECT_DOUBLE_EQ(r[0][1].start_us, 40);  // B0 on stage 0 right after B0 on stage 1
  EXPECT_DOUBLE_EQ(r[0][1].end_us, 60);
  EXPECT_DOUBLE_EQ(measured_bubble_fraction(r), theoretical_bubble_fraction(2, 1));
  // A stage that is itself idle between its own events keeps no gap either:
  // 1F1B on 2 stages, m 2, unit spans, spread out in time -> the textbook bubble 1/3.
  std::vector<StageEvents> spread{{{'F', 0, 0, 1}, {'F', 1, 3, 4}, {'B', 0, 9, 10}, {'B', 1, 20, 21}},
                                  {{'F', 0, 5, 6}, {'B', 0, 7, 8}, {'F', 1, 11, 12}, {'B', 1, 13, 14}}};
  EXPECT_NEAR(measured_bubble_fraction(without_transfers(spread)), 1.0 / 3.0, 1e-12);
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

// A zero-bubble schedule's three kinds of work in three colours: F blue, B green, W orange.
TEST(ScheduleSvg, DrawsForwardInputGradientAndWeightGradientInThreeColours) {
  std::vector<loom::parallel::StageEvents> stages = {{{'F', 0, 0, 10}, {'B', 0, 40, 50}, {'W', 0, 50, 60}},
                                                     {{'F', 0, 10, 20}, {'B', 0, 20, 30}, {'W', 0, 30, 40}}};
  const std::string svg = loom::parallel::schedule_svg(stages, "zb-h1, pp 2, m 1", "bubble");
  auto count = [&](const std::string& needle) {
    int n = 0;
    for (size_t at = svg.find(needle); at != std::string::npos; at = svg.find(needle, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("fill=\"#6fa8dc\""), 2);  // F
  EXPECT_EQ(count("fill=\"#93c47d\""), 2);  // B
  EXPECT_EQ(count("fill=\"#f6b26b\""), 2);  // W
}

// Interleaved: boxes told apart by chunk (their own shade), a tooltip on every
// box, labels where they fit, and a caption longer than the picture wrapped
// onto lines that each fit its 1000 px.
TEST(ScheduleSvg, ChunksHaveTheirOwnShadeEveryBoxATooltipAndTheCaptionWraps) {
  std::vector<loom::parallel::StageEvents> stages(2);
  for (int s = 0; s < 2; ++s)
    for (int k = 0; k < 16; ++k)
      stages[size_t(s)].push_back({k % 2 ? 'B' : 'F', k / 4, 100.0 * (2 * k + s), 100.0 * (2 * k + s) + 90, (k / 2) % 2});
  const std::string word(90, 'x');  // "bubble: xxx...x xxx...x": 189 characters, one space to break at
  std::string line = "bubble: ";
  line.append(word).append(" ").append(word);
  const std::string svg = loom::parallel::schedule_svg(stages, "interleaved", line);
  auto count = [&](const std::string& needle) {
    int n = 0;
    for (size_t at = svg.find(needle); at != std::string::npos; at = svg.find(needle, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("<title>"), 32);                    // every box
  EXPECT_EQ(count("fill=\"#6fa8dc\""), 8);            // forwards of chunk 0
  EXPECT_EQ(count("fill=\"#1c4587\""), 8);            // forwards of chunk 1
  EXPECT_EQ(count("fill=\"#93c47d\""), 8);            // backwards of chunk 0
  EXPECT_EQ(count("fill=\"#274e13\""), 8);            // backwards of chunk 1
  EXPECT_EQ(count("text-anchor=\"middle\">"), 32);    // 900 px / 32 boxes: each ~28 px, room for "F3.1" at 9 px
  EXPECT_NE(svg.find(">bubble: " + word + "</text>"), std::string::npos) << svg;  // line 1
  EXPECT_NE(svg.find(">" + word + "</text>"), std::string::npos) << svg;             // line 2
}
