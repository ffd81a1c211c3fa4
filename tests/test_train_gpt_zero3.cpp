// --zero 3 (FSDP, parallel/data_parallel/fully_sharded.h) in train_gpt against
// one process on the same global batch: per-step losses, grad norms and final
// weights within 1e-5 relative (tests/train_gpt_run.h: the tolerances, how
// runs are launched). Each unit's params exist whole only while gathered, its
// gradient is reduce-scattered into the owner's shard, and AdamW steps the
// shards: the same update per element on the same averaged gradient as one
// process, up to the order of float additions. The checkpoint written at the
// end holds the whole model (every unit gathered for it).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/train_gpt_run.h"

using namespace loom;
using namespace loom::test;

TEST(TrainGptZero3, TwoRanksMatchOneProcess) {
  expect_same_run(train("zero3_dp2", 2, "--dp 2 --batch 8 --zero 3"), single_process_batch16(), "--dp 2 --zero 3");
}

// 4 ranks: a unit's 4 shards cut through its params, and each unit is padded.
TEST(TrainGptZero3, FourRanksMatchOneProcess) {
  expect_same_run(train("zero3_dp4", 4, "--dp 4 --batch 4 --zero 3"), single_process_batch16(), "--dp 4 --zero 3");
}

// Each micro-batch reduce-scatters and adds into the grad shard.
TEST(TrainGptZero3, GradientAccumulationMatchesOneProcess) {
  expect_same_run(train("zero3_dp2_accum", 2, "--dp 2 --batch 4 --grad-accum 2 --zero 3"), single_process_batch16(),
                  "--dp 2 --batch 4 --grad-accum 2 --zero 3");
}

// dp 2 x tp 2: each tp rank's layers are its shards, and FSDP shards those
// over dp; the grad norm sums every dp and tp shard once (tp replicas counted on tp rank 0).
TEST(TrainGptZero3, WithTensorParallelMatchesOneProcess) {
  expect_same_run(train("zero3_dp2_tp2", 4, "--dp 2 --tp 2 --batch 8 --zero 3"), single_process_batch16(),
                  "--dp 2 --tp 2 --zero 3");
}

// dp 2 x tp 2 + sequence parallelism: each tp rank's layernorm gradients are
// partial sums over its T / tp tokens; the unit's hook sums them over tp
// before the dp reduce-scatter (fully_sharded.h), as ZeRO-1 and ZeRO-2 sum
// each bucket's before its reduce-scatter (data_parallel_bucket.h).
TEST(TrainGptZero3, WithSequenceParallelMatchesOneProcess) {
  expect_same_run(train("zero3_dp2_tp2_sp", 4, "--dp 2 --tp 2 --sequence-parallel --batch 8 --zero 3"),
                  single_process_batch16(), "--dp 2 --tp 2 --sequence-parallel --zero 3");
}

// The schedule's switches change when a unit is gathered, never the numbers:
// each unit gathered only in its own pre-hook (no prefetch), and kept from its
// forward to its backward (no reshard after forward).
TEST(TrainGptZero3, WithoutPrefetchOrReshardAfterForwardMatchesOneProcess) {
  const std::string cfg = "--dp 2 --batch 8 --zero 3 --zero3-prefetch off --zero3-reshard-after-forward off";
  expect_same_run(train("zero3_dp2_switches_off", 2, cfg), single_process_batch16(), cfg.c_str());
}

// --export-hf without --save: the export gathers the units first (ZeRO-3 keeps
// only shards between steps); it equals one process's export. Read as they
// were, the run trained and then stopped with "the storage of [40, 32] float32
// was released": the trained model was lost.
TEST(TrainGptZero3, ExportWithoutSaveEqualsOneProcessExport) {
  expect_same_run(train_and_export("zero3_dp2_export", 2, "--dp 2 --batch 8 --zero 3"),
                  train_and_export("single_b16_export", 1, "--batch 16"), "--dp 2 --zero 3 --export-hf");
}

TEST(TrainGptZero3, ScheduleSwitchesWithoutZero3AreRefused) {
  Result r = train("zero1_prefetch_off", 1, "--batch 16 --zero 1 --zero3-prefetch off");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--zero3-prefetch off changes ZeRO-3's schedule; it needs --zero 3 (got --zero 1)"),
            std::string::npos) << r.output;
}

// With recomputation the rerun in backward reads the unit's params: the unit
// is gathered again before its backward (the identity on its output), so the
// rerun finds them. Full: each block's forward again; selective: its core.
TEST(TrainGptZero3, WithRecomputationMatchesOneProcess) {
  for (const std::string mode : {"full", "selective"})
    expect_same_run(train("zero3_dp2_recompute_" + mode, 2, "--dp 2 --batch 8 --zero 3 --recompute " + mode),
                    single_process_batch16(), ("--dp 2 --zero 3 --recompute " + mode).c_str());
}

// dp 2 x cp 2: the units are sharded over the dp x cp group, the one the
// gradients are averaged over (each cp rank saw other tokens of the same sequences).
TEST(TrainGptZero3, WithContextParallelMatchesOneProcess) {
  // Final params within 3e-5, as for every --cp run (test_train_gpt_context_parallel.cpp says why).
  expect_same_run(train("zero3_dp2_cp2", 4, "--dp 2 --cp 2 --batch 8 --zero 3"), single_process_batch16(),
                  "--dp 2 --cp 2 --zero 3", 1e-5, 3e-5);
}

// bf16 and fp16 (loss scaling, found_inf over every shard): ZeRO-3 gives the
// numbers of ZeRO-1 at the same dp and dtype - the same fp32 sums of the same
// rounded gradients, the same fp32 main params rounded into the same params.
TEST(TrainGptZero3, Bf16MatchesZero1) {
  expect_same_run(train("zero3_dp2_bf16", 2, "--dp 2 --batch 8 --zero 3 --dtype bf16"),
                  train("zero1_dp2_bf16", 2, "--dp 2 --batch 8 --zero 1 --dtype bf16"), "--dp 2 --zero 3 --dtype bf16");
}

TEST(TrainGptZero3, Fp16WithAnOverflowMatchesZero1) {
  const std::string cfg = "--dp 2 --batch 8 --dtype fp16 --inject-overflow 3";
  Result z3 = train("zero3_dp2_fp16", 2, cfg + " --zero 3");
  expect_same_run(z3, train("zero1_dp2_fp16", 2, cfg + " --zero 1"), "--dp 2 --zero 3 --dtype fp16");
  ASSERT_EQ(z3.log.size(), 10u);
  EXPECT_NE(z3.log[3].find("\"skipped\": true"), std::string::npos) << z3.log[3];  // every rank skipped the step rank 0 overflowed
}

// A --zero 3 checkpoint holds the whole model (every unit gathered for the
// save) and each rank's optimizer shard as (param, start, end) pieces, as
// ZeRO-1 writes them: it resumes at --zero 1 on another dp size, or on one
// process, with the single-process run's losses (the resumed run appends to
// the same log: its 10 lines are compared).
TEST(TrainGptZero3, CheckpointResumesAtZero1OnTwoRanks) {
  Result first = train("zero3_to_zero1", 4, "--dp 4 --batch 4 --zero 3 --stop-at 5");
  ASSERT_EQ(first.status, 0) << first.output;
  ASSERT_TRUE(fs::exists(work_dir() / "zero3_to_zero1.step5.optim.3.safetensors"));  // one shard per rank
  expect_same_run(train("zero3_to_zero1", 2, "--dp 2 --batch 8 --zero 1 --resume " + checkpoint("zero3_to_zero1")),
                  single_process_batch16(), "--zero 3 dp 4 -> save -> --zero 1 dp 2");
}

TEST(TrainGptZero3, CheckpointResumesOnOneProcess) {
  Result first = train("zero3_to_one", 2, "--dp 2 --batch 8 --zero 3 --stop-at 5");
  ASSERT_EQ(first.status, 0) << first.output;
  expect_same_run(train("zero3_to_one", 1, "--batch 16 --resume " + checkpoint("zero3_to_one")),
                  single_process_batch16(), "--zero 3 dp 2 -> save -> one process");
}

// And into --zero 3: the loader fills each rank's main-param pieces from the
// fragments that overlap them, and refresh_model_params() rounds them into
// the units' shards (the full params are never written: the next forward
// gathers them).
TEST(TrainGptZero3, Zero1CheckpointResumesAtZero3) {
  Result first = train("zero1_to_zero3", 4, "--dp 4 --batch 4 --zero 1 --stop-at 5");
  ASSERT_EQ(first.status, 0) << first.output;
  expect_same_run(train("zero1_to_zero3", 2, "--dp 2 --batch 8 --zero 3 --resume " + checkpoint("zero1_to_zero3")),
                  single_process_batch16(), "--zero 1 dp 4 -> save -> --zero 3 dp 2");
}

// ZeRO-3 under a pipeline (issue 52; torchtitan composes FSDP2 with its
// stages): each stage's units gather and reshard per micro-batch in the
// schedule's order, and prefetch stays inside a model chunk. Untied here; the
// tied wte's two copies: test_train_gpt_zero3_tied.cpp.
const Result& single_process_untied() {
  static Result r = train("zero3_pp_one", 1, "--batch 16 --untied");
  return r;
}

TEST(TrainGptZero3, WithPipelineMatchesOneProcess) {
  for (const char* args : {"--dp 2 --pp 2 --microbatches 2 --batch 4", "--dp 2 --pp 2 --microbatches 4 --batch 2 --schedule afab",
                           "--pp 2 --virtual-stages 2 --microbatches 4 --batch 4 --layers 4"}) {
    const bool four_layers = std::string(args).find("--layers 4") != std::string::npos;
    const int ranks = std::string(args).find("--dp 2") != std::string::npos ? 4 : 2;
    Result z3 = train(str("zero3_pp_", ranks, four_layers), ranks, str(args, " --untied --zero 3"));
    const Result& one = four_layers ? train("zero3_pp_one4", 1, "--batch 16 --untied --layers 4") : single_process_untied();
    expect_same_run(z3, one, str("--zero 3 ", args, " vs one process").c_str());
  }
}

// Stopped at step 5 and resumed with the same flags: the same bits as the straight run.
TEST(TrainGptZero3, WithPipelineResumeIsBitExact) {
  const std::string args = "--dp 2 --pp 2 --microbatches 2 --batch 4 --untied --zero 3";
  Result straight = train("zero3_pp_straight", 4, args);
  Result first = train("zero3_pp_resumed", 4, args + " --stop-at 5");
  ASSERT_EQ(first.status, 0) << first.output;
  Result resumed = train("zero3_pp_resumed", 4, args + " --resume " + checkpoint("zero3_pp_resumed"));
  expect_bit_identical(resumed, straight, "--zero 3 --pp 2 stopped at 5 and resumed", "the straight run");
}

// A --memory-json run's ledger (optim/memory_report.h), parsed.
nlohmann::json memory_ledger(const std::string& name, int ranks, const std::string& args) {
  const fs::path json_path = work_dir() / (name + ".json");
  Result r = train(name, ranks, args + " --memory-json " + json_path.string());
  EXPECT_EQ(r.status, 0) << r.output;
  if (r.status != 0) return nlohmann::json{{"ranks", nlohmann::json::array()}};
  std::ifstream f(json_path);
  return nlohmann::json::parse(f);
}

// The gathered working set under a pipeline, to the byte (optim/memory_report.h):
// stage 0 runs its warm-up forwards in a row, so its last block, never
// resharded after forward, stays gathered beside the next micro-batch's pair
// (3 blocks); the last stage runs each forward then its backward (a pair).
TEST(TrainGptZero3, WithPipelineTheGatheredWorkingSetIsTheFormula) {
  const int64_t block = 12 * 32 * 32 + 13 * 32;  // fp32, dp 2: nothing padded
  for (const auto& [args, stage0, stage1] :
       {std::tuple{"--microbatches 2 --batch 4", 3 * block, 2 * block},
        std::tuple{"--microbatches 2 --batch 4 --zero3-prefetch off", 2 * block, block}}) {
    const nlohmann::json ledger =
        memory_ledger("zero3_pp_ledger", 4, str("--dp 2 --pp 2 --layers 6 --untied --zero 3 ", args));
    ASSERT_EQ(ledger["ranks"].size(), 4u) << args;
    for (const auto& rank : ledger["ranks"]) {
      const int64_t want = 4 * (rank["rank"].get<int>() < 2 ? stage0 : stage1);
      EXPECT_EQ(rank["comm"]["measured"].get<int64_t>(), want) << args << ", rank " << rank["rank"];
      EXPECT_EQ(rank["comm"]["predicted"].get<int64_t>(), want) << args << ", rank " << rank["rank"];
    }
  }
}

// --memory-json at --zero 3 (optim/memory_report.h): every rank's params,
// grads and optimizer state are its shards, (b + 4 + 4 + 8) / dp bytes a
// parameter (b = 2 for bf16 with its fp32 main params, fp32: 4 + 4 + 8, its
// main params the shards themselves), within 1% (the units' padding, AdamW's
// step counters, the padding's missing optimizer state on the last rank); the
// gathered working set at its peak - the embedding unit, held through
// backward for its tied wte, and two adjacent units - to the byte.
struct LedgerCase {
  int dp;
  const char* args;
  double bytes_per_param;
  int64_t element_bytes;  // of the model's params
};

void PrintTo(const LedgerCase& c, std::ostream* os) { *os << "dp " << c.dp << " " << c.args; }

class Zero3Ledger : public ::testing::TestWithParam<LedgerCase> {};

TEST_P(Zero3Ledger, ShardsAndTheGatheredWorkingSetAreTheFormula) {
  const LedgerCase& c = GetParam();
  const std::string name = "zero3_ledger_dp" + std::to_string(c.dp);
  const fs::path json_path = work_dir() / (name + ".json");
  Result r = train(name, c.dp, str("--dp ", c.dp, " --zero 3 ", c.args, " --memory-json ", json_path.string()));
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream f(json_path);
  nlohmann::json ledger = nlohmann::json::parse(f);
  ASSERT_EQ(ledger["ranks"].size(), size_t(c.dp));
  for (const auto& rank : ledger["ranks"]) {
    const double n = rank["num_params"].get<double>();
    EXPECT_EQ(n, 27264) << "the whole model's params, counted once";
    double total = 0;
    for (const char* kind : {"params", "grads", "optimizer"}) {
      const double measured = rank[kind]["measured"].get<double>(), predicted = rank[kind]["predicted"].get<double>();
      EXPECT_NEAR(measured, predicted, 0.01 * predicted) << "dp " << c.dp << " rank " << rank["rank"] << " " << kind;
      total += measured;
    }
    EXPECT_NEAR(total / n, c.bytes_per_param, 0.01 * c.bytes_per_param) << "dp " << c.dp << " rank " << rank["rank"];
    const int64_t gathered = rank["comm"]["measured"].get<int64_t>();
    EXPECT_EQ(gathered, rank["comm"]["predicted"].get<int64_t>()) << "dp " << c.dp << ": the gathered working set";
    const int64_t whole = int64_t(n) * c.element_bytes;
    EXPECT_LT(gathered, whole) << "less than the whole model";
    std::printf("[ measured ] --zero 3 dp %d rank %d: %.2f bytes/param (formula %.2f), gathered working set %lld "
                "bytes of the model's %lld\n", c.dp, rank["rank"].get<int>(), total / n, c.bytes_per_param,
                (long long)gathered, (long long)whole);
  }
}

INSTANTIATE_TEST_SUITE_P(Dp234, Zero3Ledger,
                         ::testing::Values(LedgerCase{2, "--batch 8 --dtype bf16", 18.0 / 2, 2},
                                           LedgerCase{3, "--batch 4 --dtype bf16", 18.0 / 3, 2},
                                           LedgerCase{4, "--batch 4", 16.0 / 4, 4}),
                         [](const auto& info) { return "dp" + std::to_string(info.param.dp); });

// The schedule switches' working sets (bf16, dp 2, nothing padded): without
// prefetch one unit computes beside the embedding's (held for the tied wte),
// without reshard after forward every unit stays gathered until its backward.
// Embedding 40 x 32 + 16 x 32 (vocab 40, block 16), a block 12 C² + 13 C, the head's ln_f 2 C.
TEST(TrainGptZero3, ScheduleSwitchesWorkingSetsAreTheFormula) {
  const int64_t embedding = 40 * 32 + 16 * 32, block = 12 * 32 * 32 + 13 * 32, head = 2 * 32;
  for (const auto& [flag, elements] : {std::pair{"--zero3-prefetch off", embedding + block},
                                       std::pair{"--zero3-reshard-after-forward off", embedding + 2 * block + head}}) {
    const nlohmann::json ledger =
        memory_ledger("zero3_switch_ledger", 2, str("--dp 2 --batch 8 --dtype bf16 --zero 3 ", flag));
    ASSERT_EQ(ledger["ranks"].size(), 2u) << flag;
    for (const auto& rank : ledger["ranks"]) {
      EXPECT_EQ(rank["comm"]["measured"].get<int64_t>(), 2 * elements) << flag << ", rank " << rank["rank"];
      EXPECT_EQ(rank["comm"]["predicted"].get<int64_t>(), 2 * elements) << flag << ", rank " << rank["rank"];
    }
  }
}
