// --zero 3 (FSDP, parallel/data_parallel/fully_sharded.h) in train_gpt against
// one process on the same global batch: per-step losses, grad norms and final
// weights within 1e-5 relative (tests/train_gpt_run.h: the tolerances, how
// runs are launched). Each unit's params exist whole only while gathered, its
// gradient is reduce-scattered into the owner's shard, and AdamW steps the
// shards: the same update per element on the same averaged gradient as one
// process, up to the order of float additions. The checkpoint written at the
// end holds the whole model (every unit gathered for it).
#include <gtest/gtest.h>

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

TEST(TrainGptZero3, PipelineIsRefusedWithTheReason) {
  Result r = train("zero3_pp2", 2, "--pp 2 --batch 16 --zero 3");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--zero 3 with --pp 2: the tied embedding"), std::string::npos) << r.output;
}
