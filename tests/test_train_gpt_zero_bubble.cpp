// The zero-bubble schedules in train_gpt (parallel/pipeline_parallel/zero_bubble_schedule.h):
// each run is bit-identical to the same run under 1F1B - the same per-step
// losses and gradient norms, the same saved weights, byte for byte - and
// equal to one process within train_gpt_run.h's tolerances: ZB-H1 runs the
// same sums as 1F1B, only the order of micro-batches' F, B and W differs, and
// every gradient hook (data parallel's buckets, ZeRO's reduce-scatters, the
// tied embedding's sum after the schedule) sees W's gradients.
#include <gtest/gtest.h>

#include "tests/train_gpt_run.h"

using namespace loom;
using namespace loom::test;

namespace {

// Runs `args` under --schedule zb-h1 and 1f1b; the zb run's Result.
Result zb_and_1f1b(const std::string& name, int ranks, const std::string& args) {
  Result zb = train(name + "_zb", ranks, args + " --schedule zb-h1");
  expect_bit_identical(zb, train(name + "_1f1b", ranks, args + " --schedule 1f1b"), name, "--schedule 1f1b");
  return zb;
}

}  // namespace

// The tied embedding on stage 0 (wte) and on the last stage (the head's copy):
// its two gradients meet after the schedule, each summed from W's.
TEST(TrainGptZeroBubble, ZBH1TwoStagesIsBitIdenticalTo1F1BAndMatchesOneProcess) {
  expect_same_run(zb_and_1f1b("pp2", 2, "--pp 2 --microbatches 4 --batch 4"), single_process_batch16(), "--pp 2 zb-h1");
  expect_tied_copies_identical("pp2_zb");
}

// Four layers on three stages, with activation recomputation: a checkpointed
// block reruns its forward inside B, and its weights' gradients wait for W.
TEST(TrainGptZeroBubble, ZBH1ThreeStagesWithRecomputeIsBitIdenticalTo1F1BAndMatchesOneProcess) {
  expect_same_run(zb_and_1f1b("pp3", 3, "--pp 3 --microbatches 4 --batch 4 --recompute full"), single_process_batch16(),
                  "--pp 3 zb-h1 --recompute full");
}

TEST(TrainGptZeroBubble, ZBH1FourStagesIsBitIdenticalTo1F1BAndMatchesOneProcess) {
  expect_same_run(zb_and_1f1b("pp4", 4, "--pp 4 --microbatches 8 --batch 2"), single_process_batch16(), "--pp 4 zb-h1");
  expect_tied_copies_identical("pp4_zb");
}

// dp 2: the bucket hooks fire in W, the buckets' reductions launch in the last
// W and are waited for after the schedule. ZeRO-2 reduce-scatters every
// micro-batch's buckets, in that micro-batch's W.
TEST(TrainGptZeroBubble, ZBH1WithDataParallelAndZeRO2IsBitIdenticalTo1F1BAndMatchesOneProcess) {
  expect_same_run(zb_and_1f1b("dp2_pp2_zero2", 4, "--dp 2 --pp 2 --microbatches 2 --batch 4 --zero 2"),
                  single_process_batch16(), "--dp 2 --pp 2 --zero 2 zb-h1");
}

// bf16 params with fp32 main params and ZeRO-1: bit-identical to 1F1B (one
// process's bf16 run rounds elsewhere; 1F1B's is tested against it).
TEST(TrainGptZeroBubble, ZBH1WithZeRO1InBf16IsBitIdenticalTo1F1B) {
  zb_and_1f1b("dp2_pp2_zero1_bf16", 4, "--dp 2 --pp 2 --microbatches 2 --batch 4 --zero 1 --dtype bf16");
}

// Tensor parallel: the column- and row-parallel linears split like any linear;
// their tp collectives are on the input's path, in B, on both tp ranks alike.
TEST(TrainGptZeroBubble, ZBH1WithTensorParallelIsBitIdenticalTo1F1BAndMatchesOneProcess) {
  expect_same_run(zb_and_1f1b("tp2_pp2", 4, "--tp 2 --pp 2 --microbatches 4 --batch 4"), single_process_batch16(),
                  "--tp 2 --pp 2 zb-h1");
}

TEST(TrainGptZeroBubble, ZBH1LlamaIsBitIdenticalTo1F1B) {
  zb_and_1f1b("llama_pp2", 2, "--arch llama --pp 2 --microbatches 4 --batch 4");
}

// --print-schedule: the executed order with W's own slots, and the bubble
// against ZB-H1's formula (F = B = W) and 1F1B's.
TEST(TrainGptZeroBubble, PrintScheduleShowsBAndWApartAndZBH1sBubble) {
  Result r = train("pp2_print", 2, "--pp 2 --microbatches 4 --batch 4 --schedule zb-h1 --print-schedule", false);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("stage 0 | F0 F1 .  B0 W0 F2 B1 W1 F3 B2 W2 B3 W3\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("stage 1 | .  F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("theory with F = B = W (p - 1)/(3 m + p - 1) = 1/13 = 0.077 (1F1B's: (p - 1)/(m + p - 1) "
                          "= 0.200)"),
            std::string::npos)
      << r.output;
}

TEST(TrainGptZeroBubble, RefusesWhatItDoesNotRun) {
  struct Case {
    int ranks;
    std::string args, message;
  };
  for (const Case& c : {Case{1, "--schedule zb-h1", "--schedule zb-h1 orders a pipeline's backwards; it needs --pp >= 2"},
                        Case{2, "--pp 2 --schedule zb-h1 --virtual-stages 2 --microbatches 2",
                             "--virtual-stages 2 runs interleaved 1F1B; --schedule zb-h1 has no interleaved form"},
                        Case{2, "--pp 2 --schedule zb-h1 --device cuda",
                             "the zero-bubble schedules are tested on the CPU only so far"},
                        Case{2, "--pp 2 --teach-break zb-sync-at-b",
                             "--teach-break zb-sync-at-b breaks where the zero-bubble schedule syncs data parallelism"}}) {
    Result r = train("refused", c.ranks, c.args, /*save=*/false);
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
}
