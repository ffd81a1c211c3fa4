// --zero 3 with --pp and GPT-2's tied embedding (issue 52), against one process
// on the same global batch (tests/train_gpt_run.h: tolerances, launches).
// wte lives twice: in the first stage's embedding and in the last stage's
// head. Each copy is a FullyShardedDataParallel unit of its own
// (fully_sharded.h's own_units), padded alike, so dp rank r's shard holds the
// same elements of wte on both stages; after the schedule
// finalize_model_grads sums the two grad shards over the embedding group.
// Both copies then take the same AdamW step on the same elements and stay
// bit-identical. Each run: 10 steps of a 2-layer, 32-wide model on 4 ranks.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/train_gpt_run.h"

using namespace loom;
using namespace loom::test;

namespace {

const Result& one_process_4_layers() {
  static Result r = train("zero3_tied_one4", 1, "--batch 16 --layers 4");
  return r;
}

}  // namespace

// 1F1B, dp 2 x pp 2: the embedding group sums the two stages' wte grad shards.
// Without that sum (each copy stepped on its own stage's part; a mutation of
// shared_weights.cpp, measured) the first grad norm is 6.4e-2 off and the
// second loss 1.9e-3, and the copies part.
TEST(TrainGptZero3Tied, PipelineMatchesOneProcess) {
  const std::string args = "--dp 2 --pp 2 --microbatches 2 --batch 4 --zero 3";
  Result z3 = train("zero3_tied_pp2", 4, args);
  expect_same_run(z3, single_process_batch16(), "--zero 3 --pp 2, tied wte, vs one process");
  expect_tied_copies_identical("zero3_tied_pp2");
}

// Interleaved 1F1B (pp 2 x 2 chunks) and the V of ZB-V, where both ends of the
// model sit on stage 0 and wte is one tensor again (no embedding group).
TEST(TrainGptZero3Tied, InterleavedAndVMatchOneProcess) {
  for (const char* schedule : {"--virtual-stages 2", "--virtual-stages 2 --schedule zb-v"}) {
    Result z3 = train("zero3_tied_v", 4, str("--dp 2 --pp 2 --microbatches 4 --batch 2 --layers 4 --zero 3 ", schedule));
    expect_same_run(z3, one_process_4_layers(), str("--zero 3 --pp 2 ", schedule, ", tied wte").c_str());
  }
}

// Stopped at step 5 and resumed with the same flags: the same bits; and the
// export (no --save) equals one process's export.
TEST(TrainGptZero3Tied, ResumeIsBitExactAndExportEqualsOneProcess) {
  const std::string args = "--dp 2 --pp 2 --microbatches 2 --batch 4 --zero 3";
  Result straight = train("zero3_tied_straight", 4, args);
  Result first = train("zero3_tied_resumed", 4, args + " --stop-at 5");
  ASSERT_EQ(first.status, 0) << first.output;
  Result resumed = train("zero3_tied_resumed", 4, args + " --resume " + checkpoint("zero3_tied_resumed"));
  expect_bit_identical(resumed, straight, "--zero 3 --pp 2 (tied) stopped at 5 and resumed", "the straight run");
  expect_same_run(train_and_export("zero3_tied_export", 4, args),
                  train_and_export("zero3_tied_one_export", 1, "--batch 16"), "--zero 3 --pp 2 (tied) --export-hf");
}

// The ledger (optim/memory_report.h): params, grads and optimizer state are
// the shards, wte's own unit among them (within 1%: AdamW's step counters);
// the gathered working set to the byte, wte counted with the layer that reads
// it (the embedding on stage 0, the head on stage 1). By hand (fp32, dp 2,
// nothing padded; vocab 40, block 16, C 32): stage 0 runs two forwards in a
// row, so its block (12 C² + 13 C) stays gathered beside the embedding layer
// (wpe 16 C + wte 40 C); on stage 1 the block and the prefetched head (ln_f
// 2 C + wte 40 C) are gathered together.
TEST(TrainGptZero3Tied, TheLedgerIsTheFormula) {
  const int64_t block = 12 * 32 * 32 + 13 * 32, wte = 40 * 32;
  const int64_t stage0 = 4 * (block + 16 * 32 + wte), stage1 = 4 * (block + 2 * 32 + wte);
  const fs::path json_path = work_dir() / "zero3_tied_ledger.json";
  Result r = train("zero3_tied_ledger", 4,
                   "--dp 2 --pp 2 --microbatches 2 --batch 4 --zero 3 --memory-json " + json_path.string());
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream f(json_path);
  const nlohmann::json ledger = nlohmann::json::parse(f);
  ASSERT_EQ(ledger["ranks"].size(), 4u);
  for (const auto& rank : ledger["ranks"]) {
    for (const char* kind : {"params", "grads", "optimizer"}) {
      const double measured = rank[kind]["measured"].get<double>(), predicted = rank[kind]["predicted"].get<double>();
      EXPECT_NEAR(measured, predicted, 0.01 * predicted) << "rank " << rank["rank"] << " " << kind;
    }
    const int64_t want = rank["rank"].get<int>() < 2 ? stage0 : stage1;
    EXPECT_EQ(rank["comm"]["measured"].get<int64_t>(), want) << "rank " << rank["rank"] << ": the gathered working set";
    EXPECT_EQ(rank["comm"]["predicted"].get<int64_t>(), want) << "rank " << rank["rank"];
  }
}

// --teach-break skip-tied-sync's symptom compares the whole copies, which
// ZeRO-3 never holds between steps: refused before training, naming the flags.
TEST(TrainGptZero3Tied, SkipTiedSyncTeachBreakIsRefused) {
  Result r = train("zero3_tied_teach", 4, "--dp 2 --pp 2 --microbatches 2 --batch 4 --zero 3 --teach-break skip-tied-sync");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--teach-break skip-tied-sync with --zero 3"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step     1"), std::string::npos) << "refused before training\n" << r.output;
}
