// ZB-V and DualPipeV in train_gpt (parallel/pipeline_parallel/zbv_schedule.h,
// dualpipev_schedule.h): two chunks per rank in a V, so the first and the last
// layer - the tied embedding's two uses - sit on stage 0, as one tensor, and
// the turn of the V on the last stage hands chunk 0's output to chunk 1 in
// memory. Each run equals one process within train_gpt_run.h's tolerances and,
// where the summation order allows, is bit-identical to 1F1B's: with an untied
// head every weight's gradient is summed over the micro-batches in the same
// order as 1F1B sums it (each chunk's W's run in micro-batch order). A tied
// wte is summed differently - 1F1B adds the embedding's and the head's sums
// after the schedule, the V adds every micro-batch's two parts into one
// tensor as its W's run - so those runs are held to one process's tolerance.
#include <gtest/gtest.h>

#include "tests/train_gpt_run.h"

using namespace loom;
using namespace loom::test;

namespace {

const char* const kV = " --virtual-stages 2 --schedule ";

// Runs `args` (untied) under `schedule` and 1F1B: bit-identical; the V run's Result.
Result v_and_1f1b(const std::string& name, int ranks, const std::string& args, const std::string& schedule) {
  Result v = train(name + "_" + schedule, ranks, args + " --untied" + kV + schedule);
  expect_bit_identical(v, train(name + "_1f1b", ranks, args + " --untied --schedule 1f1b"), name + " " + schedule,
                       "--schedule 1f1b");
  return v;
}

const Result& one_process(const std::string& layers, bool untied) {
  static std::map<std::string, Result> runs;
  const std::string key = layers + (untied ? "u" : "t");
  if (!runs.count(key)) runs[key] = train("one_" + key, 1, "--batch 16 --layers " + layers + (untied ? " --untied" : ""));
  return runs[key];
}

}  // namespace

// Two stages, four items (embedding, 2 blocks, head): stage 0 holds the
// embedding and the head, stage 1 the two blocks and the turn.
TEST(TrainGptZeroBubbleV, ZBVTwoStagesMatchesOneProcessAndIsBitIdenticalTo1F1BUntied) {
  expect_same_run(train("zbv_pp2", 2, str("--pp 2 --microbatches 4 --batch 4", kV, "zb-v")), one_process("2", false),
                  "--pp 2 zb-v");
  expect_same_run(v_and_1f1b("pp2", 2, "--pp 2 --microbatches 4 --batch 4", "zb-v"), one_process("2", true),
                  "--pp 2 zb-v --untied");
}

TEST(TrainGptZeroBubbleV, ZBVThreeAndFourStagesMatchOneProcess) {
  expect_same_run(train("zbv_pp3", 3, str("--pp 3 --layers 4 --microbatches 4 --batch 4", kV, "zb-v")),
                  one_process("4", false), "--pp 3 zb-v");
  expect_same_run(v_and_1f1b("pp4", 4, "--pp 4 --layers 6 --microbatches 8 --batch 2", "zb-v"), one_process("6", true),
                  "--pp 4 zb-v --untied");
}

// dp 2: the hooks fire in W; the buckets launch in the rank's last W. ZeRO-2
// reduce-scatters each micro-batch's buckets in its W's. Naive dp all-reduces
// in each chunk's W of the last micro-batch: the run that shows a sync given to
// the wrong op (bucketed dp launches what no hook launched when it finishes).
TEST(TrainGptZeroBubbleV, ZBVWithDataParallelZeRO2AndTensorParallelMatchOneProcess) {
  expect_same_run(train("zbv_dp2_naive", 4, str("--dp 2 --pp 2 --dp-mode naive --microbatches 2 --batch 4", kV, "zb-v")),
                  one_process("2", false), "--dp 2 --pp 2 --dp-mode naive zb-v");
  expect_same_run(v_and_1f1b("dp2_pp2_zero2", 4, "--dp 2 --pp 2 --microbatches 2 --batch 4 --zero 2", "zb-v"),
                  one_process("2", true), "--dp 2 --pp 2 --zero 2 zb-v");
  expect_same_run(train("zbv_tp2_pp2", 4, str("--tp 2 --pp 2 --microbatches 4 --batch 4", kV, "zb-v")),
                  one_process("2", false), "--tp 2 --pp 2 zb-v");
}

// bf16 params, fp32 main params, ZeRO-1 (one process's bf16 rounds elsewhere;
// 1F1B's is tested against it).
TEST(TrainGptZeroBubbleV, ZBVWithZeRO1InBf16IsBitIdenticalTo1F1B) {
  v_and_1f1b("dp2_pp2_zero1_bf16", 4, "--dp 2 --pp 2 --microbatches 2 --batch 4 --zero 1 --dtype bf16", "zb-v");
}

TEST(TrainGptZeroBubbleV, DualPipeVMatchesOneProcessAndIsBitIdenticalTo1F1BUntied) {
  expect_same_run(train("dpv_pp2", 2, str("--pp 2 --microbatches 4 --batch 4", kV, "dualpipev")),
                  one_process("2", false), "--pp 2 dualpipev");
  expect_same_run(v_and_1f1b("pp3", 3, "--pp 3 --layers 4 --microbatches 8 --batch 2", "dualpipev"),
                  one_process("4", true), "--pp 3 dualpipev --untied");
  expect_same_run(train("dpv_pp4", 4, str("--pp 4 --layers 6 --microbatches 8 --batch 2", kV, "dualpipev")),
                  one_process("6", false), "--pp 4 dualpipev");
}

TEST(TrainGptZeroBubbleV, DualPipeVWithDataParallelTensorParallelAndZeRO) {
  expect_same_run(
      train("dpv_dp2_naive", 4, str("--dp 2 --pp 2 --dp-mode naive --microbatches 4 --batch 2", kV, "dualpipev")),
      one_process("2", false), "--dp 2 --pp 2 --dp-mode naive dualpipev");
  expect_same_run(v_and_1f1b("dp2_pp2_zero1", 4, "--dp 2 --pp 2 --microbatches 4 --batch 2 --zero 1", "dualpipev"),
                  one_process("2", true), "--dp 2 --pp 2 --zero 1 dualpipev");
  v_and_1f1b("dp2_pp2_zero2_bf16", 4, "--dp 2 --pp 2 --microbatches 4 --batch 2 --zero 2 --dtype bf16", "dualpipev");
  expect_same_run(train("dpv_tp2_pp2", 4, str("--tp 2 --pp 2 --microbatches 4 --batch 4", kV, "dualpipev")),
                  one_process("2", false), "--tp 2 --pp 2 dualpipev");
}

// Validation runs every micro-batch down and back up the V (eval_step_pipeline
// with the V's links and its turn), and the loss comes back from stage 0.
TEST(TrainGptZeroBubbleV, ValidationThroughTheVIsBitIdenticalTo1F1Bs) {
  const std::string args = "--pp 2 --microbatches 4 --batch 4 --eval-every 5 --untied";
  Result v = train("zbv_eval", 2, args + kV + "zb-v", false), ref = train("1f1b_eval", 2, args + " --schedule 1f1b", false);
  ASSERT_EQ(v.status, 0) << v.output;
  ASSERT_EQ(ref.status, 0) << ref.output;
  int evaluated = 0;
  for (size_t i = 0; i < ref.log.size(); ++i)
    if (ref.log[i].find("val_loss") != std::string::npos) {
      EXPECT_EQ(field(v.log[i], "val_loss"), field(ref.log[i], "val_loss")) << "step " << i;
      ++evaluated;
    }
  EXPECT_EQ(evaluated, 2);
}

// --print-schedule: the V's order as it ran, the turn on stage 1, and the V's bubble beside ZB-H1's and 1F1B's.
TEST(TrainGptZeroBubbleV, PrintScheduleShowsTheV) {
  Result r = train("zbv_print", 2, str("--pp 2 --microbatches 4 --batch 4 --print-schedule", kV, "zb-v"), false);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("stage 1 | .    F0.0 F0.1 F1.0 F1.1 B0.1 W0.1 F2.0 B0.0 W0.0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("theory with F = B = W on a chunk (p - 1)/(6 m + p - 1) = 1/25 = 0.040 (ZB-H1's: 0.077, "
                          "1F1B's: 0.200)"),
            std::string::npos)
      << r.output;
}

TEST(TrainGptZeroBubbleV, RefusesWhatItDoesNotRun) {
  struct Case {
    int ranks;
    std::string args, message;
  };
  for (const Case& c :
       {Case{2, "--pp 2 --schedule zb-v", "--schedule zb-v lays two chunks on every rank in a V; it needs "
                                          "--virtual-stages 2 (got --virtual-stages 1)"},
        Case{2, "--pp 2 --schedule dualpipev --virtual-stages 2 --microbatches 2",
             "--schedule dualpipev needs at least 2 pp micro-batches (one per virtual stage), got 2 for pp 2"},
        Case{2, "--pp 2 --schedule zb-v --virtual-stages 2 --teach-break skip-tied-sync",
             "the tied embedding is one tensor and there is no sync to skip"},
        Case{1, "--schedule zb-v --virtual-stages 2", "--schedule zb-v orders a pipeline's backwards; it needs --pp >= 2"},
        // --memory-report's formula does not walk ZeRO-3's units through a V yet (optim/zero3_activations.h)
        Case{1, "--dp 2 --pp 2 --zero 3 --schedule dualpipev --virtual-stages 2 --microbatches 4 --memory-report",
             "--memory-report with --zero 3 and --schedule dualpipev: the activation formula does not walk ZeRO-3's "
             "units through a V's chunks yet"},
        // nor, at any ZeRO level, what full recomputation or sequence parallelism keeps through B
        Case{1, "--pp 2 --schedule zb-h1 --microbatches 2 --recompute full --memory-report",
             "--memory-report with --schedule zb-h1 and --recompute full: the activation formula's walk of the split "
             "backward does not count what --recompute full keeps through B yet"},
        Case{1, "--pp 2 --tp 2 --sequence-parallel --schedule zb-v --virtual-stages 2 --microbatches 2 --memory-report",
             "--memory-report with --schedule zb-v and --sequence-parallel: the activation formula's walk of the "
             "split backward does not count what --sequence-parallel keeps through B yet"}}) {
    Result r = train("refused", c.ranks, c.args, /*save=*/false);
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
}
