// train_gpt --recompute selective and full against --recompute none: the same
// run to the bit (every logged loss and grad norm, every final weight), for
// each dtype, with dropout, and under dp, pp, tp and ZeRO. Recomputation
// reruns the same kernels on the same inputs with the same dropout offsets,
// so nothing may differ - not even the last bit that the parallel modes'
// tolerances (train_gpt_run.h) allow. Each run: 10 steps of the tiny GPT; each
// case pairs a dtype with a parallel mode, so four cases cover fp32, bf16,
// fp16, dropout, dp, pp, tp (with sequence parallelism) and ZeRO.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "tests/train_gpt_run.h"

using namespace loom;
using namespace loom::test;

namespace {

// (name, ranks, flags)
using Case = std::tuple<std::string, int, std::string>;
class TrainGptRecompute : public ::testing::TestWithParam<Case> {};

TEST_P(TrainGptRecompute, SelectiveAndFullAreBitIdenticalToNone) {
  const auto& [name, ranks, flags] = GetParam();
  const Result none = train(name + "_none", ranks, flags);
  for (const std::string mode : {"selective", "full"}) {
    const Result got = train(name + "_" + mode, ranks, flags + " --recompute " + mode);
    ASSERT_EQ(got.status, 0) << got.output;
    EXPECT_NE(got.output.find("recompute: " + mode), std::string::npos) << got.output;
    expect_bit_identical(got, none, flags + " --recompute " + mode, "--recompute none");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, TrainGptRecompute,
    ::testing::Values(Case{"fp32_dropout", 1, "--batch 4 --dropout 0.2"},
                      Case{"pp2_fp16", 2, "--pp 2 --batch 2 --microbatches 2 --dtype fp16"},
                      Case{"tp2_sp_fp32", 2, "--tp 2 --batch 4 --sequence-parallel"},
                      Case{"zero_bf16", 2, "--dp 2 --zero --batch 2 --dtype bf16"}),
    [](const auto& info) { return std::get<0>(info.param); });

// The rerun's dropout masks matter: with --teach-break recompute-fresh-dropout
// (the rerun draws the next call's masks) the losses leave --recompute none's
// from the second step on (the first loss is computed before any backward).
TEST(TrainGptRecompute, AFreshDropoutMaskOnTheRerunChangesTheRun) {
  const std::string flags = "--batch 4 --dropout 0.2 --recompute full";
  const Result ref = train("fresh_ref", 1, flags);
  const Result broken = train("fresh_broken", 1, flags + " --teach-break recompute-fresh-dropout");
  ASSERT_EQ(ref.status, 0) << ref.output;
  ASSERT_EQ(broken.status, 0) << broken.output;
  ASSERT_EQ(broken.losses.size(), 10u);
  EXPECT_EQ(broken.losses[0], ref.losses[0]);
  EXPECT_NE(broken.grad_norms[0], ref.grad_norms[0]);
  for (size_t i = 1; i < 10; ++i) EXPECT_NE(broken.losses[i], ref.losses[i]) << "step " << i;
}

TEST(TrainGptRecompute, AnUnknownModeIsRefusedBeforeTraining) {
  const Result r = train("bad_mode", 1, "--batch 4 --recompute blocks");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--recompute 'blocks': expected none, selective (the attention core) or full (each block)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("step"), std::string::npos) << r.output;
}

TEST(TrainGptRecompute, TheFreshDropoutBreakNeedsRecomputeAndDropout) {
  const Result r = train("bad_break", 1, "--batch 4 --teach-break recompute-fresh-dropout");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("it needs --recompute selective or full and --dropout > 0 (got --recompute none "
                          "--dropout 0)"),
            std::string::npos)
      << r.output;
}

}  // namespace
