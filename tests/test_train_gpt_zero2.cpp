// --zero 2 (ZeRO-2, parallel/data_parallel/grad_shards.h) against one process
// on the same global batch, as every parallel mode of train_gpt is
// (tests/train_gpt_run.h: losses and final params within 1e-5 relative).
// Small buckets (--bucket-mb 0.01: 2621 elements, ten or so buckets) so that
// the two scratches are taken, reduced through and given back many times a
// backward. Where ZeRO-1 does the same arithmetic - one micro-batch, where the
// shard starts at zero and receives one reduce-scatter - the runs are equal
// bit for bit, which is how bf16 and fp16 are checked (ZeRO-1's own bf16 and
// fp16 runs are compared with fp32 in test_train_gpt_parallel.cpp).
// And the flag: --zero N, --zero alone meaning 1.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "tests/train_gpt_run.h"

using namespace loom;
using namespace loom::test;

namespace {

const std::string kSmallBuckets = " --bucket-mb 0.01";

// Same losses, grad norms, skip flags and final weights, bit for bit.
void expect_identical_runs(const Result& a, const Result& b, const char* what) {
  ASSERT_EQ(a.status, 0) << what << "\n" << a.output;
  ASSERT_EQ(b.status, 0) << what << " (reference)\n" << b.output;
  ASSERT_EQ(a.losses.size(), 10u) << what;
  EXPECT_EQ(a.losses, b.losses) << what;
  EXPECT_EQ(a.grad_norms, b.grad_norms) << what;
  ASSERT_EQ(a.weights.tensors.size(), b.weights.tensors.size()) << what;
  for (const auto& [name, t] : b.weights.tensors)
    EXPECT_EQ(ops::to(a.weights.at(name), kFloat32).to_vector<float>(), ops::to(t, kFloat32).to_vector<float>())
        << what << ": " << name;
}

}  // namespace

// A dp group of one: the shard is the whole bucket, still filled through a scratch.
TEST(Zero2, OneRankMatchesThePlainRun) {
  expect_same_run(train("z2_dp1", 1, "--batch 16 --zero 2" + kSmallBuckets), single_process_batch16(), "--zero 2");
}

TEST(Zero2, TwoRanksMatchesOneProcess) {
  expect_same_run(train("z2_dp2", 2, "--dp 2 --batch 8 --zero 2" + kSmallBuckets), single_process_batch16(),
                  "--dp 2 --zero 2");
}

TEST(Zero2, FourRanksMatchesOneProcess) {
  expect_same_run(train("z2_dp4", 4, "--dp 4 --batch 4 --zero 2" + kSmallBuckets), single_process_batch16(),
                  "--dp 4 --zero 2");
}

TEST(Zero2, WithTensorParallelMatchesOneProcess) {
  expect_same_run(train("z2_dp2_tp2", 4, "--dp 2 --tp 2 --batch 8 --zero 2" + kSmallBuckets), single_process_batch16(),
                  "--dp 2 --tp 2 --zero 2");
}

// Sequence parallelism: each tp rank's layernorm gradients are partial sums
// over its T / tp tokens, summed over tp in each bucket before its
// reduce-scatter (data_parallel_bucket.h) - in every micro-batch, as ZeRO-2
// reduce-scatters each. With small buckets most of them hold a layernorm
// (summed after the sync instead, the run stopped at the first step: a
// reduce-scattered bucket leaves no whole gradient to sum).
TEST(Zero2, WithSequenceParallelMatchesOneProcess) {
  const std::string cfg = "--dp 2 --tp 2 --sequence-parallel --batch 4 --grad-accum 2 --zero 2" + kSmallBuckets;
  expect_same_run(train("z2_dp2_tp2_sp", 4, cfg), single_process_batch16(), cfg.c_str());
}

// The tied embedding's bucket stays whole (all-reduced, for the sum over the
// embedding group); the others are sharded. Every micro-batch of the pipeline
// reduce-scatters (grad_shards.h: the accumulation trade).
TEST(Zero2, WithPipelineMatchesOneProcess) {
  expect_same_run(train("z2_dp2_pp2", 4, "--dp 2 --pp 2 --microbatches 2 --batch 4 --zero 2" + kSmallBuckets),
                  single_process_batch16(), "--dp 2 --pp 2 --zero 2");
}

// Two micro-batches: each is reduce-scattered on its own and the shard sums
// the two averages (ZeRO-1 sums the full buffer first, then reduces once) -
// through the same two scratches: the grads row of --memory-json is the
// formula's (shards + 2 scratches), not a scratch per bucket kept across
// micro-batches (which would give the right numbers for ZeRO-1's memory).
TEST(Zero2, GradientAccumulationMatchesOneProcess) {
  const fs::path json = work_dir() / "z2_dp2_accum_memory.json";
  Result r = train("z2_dp2_accum", 2, "--dp 2 --batch 4 --grad-accum 2 --zero 2 --memory-json " + json.string() +
                                          kSmallBuckets);
  expect_same_run(r, single_process_batch16(), "--dp 2 --grad-accum 2 --zero 2");
  std::ifstream f(json);
  std::stringstream text;
  text << f.rdbuf();
  for (int rank : {0, 1}) {  // "grads": {"measured": B, "predicted": B}, each rank's line
    const std::string line = [&] {
      std::string all = text.str();
      size_t at = all.find("{\"rank\": " + std::to_string(rank));
      return at == std::string::npos ? std::string() : all.substr(at, all.find('\n', at) - at);
    }();
    ASSERT_FALSE(line.empty()) << text.str();
    const double measured = field(line.substr(line.find("\"grads\"")), "measured");
    const double predicted = field(line.substr(line.find("\"grads\"")), "predicted");
    EXPECT_EQ(measured, predicted) << "rank " << rank << ": " << line;
    EXPECT_LT(measured, 4 * field(line, "num_params")) << "rank " << rank << ": ZeRO-1 keeps 4 bytes a param";
  }
}

TEST(Zero2, Bf16EqualsZero1BitForBit) {
  const std::string cfg = "--dp 2 --batch 8 --dtype bf16" + kSmallBuckets;
  expect_identical_runs(train("z2_bf16", 2, cfg + " --zero 2"), train("z1_bf16", 2, cfg + " --zero 1"),
                        "bf16 --zero 2 vs --zero 1");
}

// fp16 with an inf put into rank 0's shard at step 3: found_inf (over the
// world, as each rank holds one shard) makes every rank skip that step, as
// under ZeRO-1.
TEST(Zero2, Fp16WithAnOverflowEqualsZero1BitForBit) {
  const std::string cfg = "--dp 2 --batch 8 --dtype fp16 --inject-overflow 3" + kSmallBuckets;
  Result z2 = train("z2_fp16", 2, cfg + " --zero 2");
  expect_identical_runs(z2, train("z1_fp16", 2, cfg + " --zero 1"), "fp16 --zero 2 vs --zero 1");
  for (size_t i = 0; i < z2.log.size(); ++i)
    EXPECT_EQ(z2.log[i].find("\"skipped\": true") != std::string::npos, i == 3) << z2.log[i];
}

// ZeRO-2's optimizer state is ZeRO-1's (the same shards), so its checkpoints
// are ZeRO-1's: 5 steps at --zero 2, save, 5 more elsewhere; the resumed run
// appends to the same log.
TEST(Zero2, CheckpointResumesOnOneProcess) {
  Result first = train("z2_to_1", 2, "--dp 2 --batch 8 --zero 2 --stop-at 5" + kSmallBuckets);
  ASSERT_EQ(first.status, 0) << first.output;
  expect_same_run(train("z2_to_1", 1, "--batch 16 --resume " + checkpoint("z2_to_1")), single_process_batch16(),
                  "--zero 2 dp 2 -> save -> one process");
}

TEST(Zero2, CheckpointResumesAtZero1OnOtherRanks) {
  Result first = train("z2_to_z1", 4, "--dp 4 --batch 4 --zero 2 --stop-at 5" + kSmallBuckets);
  ASSERT_EQ(first.status, 0) << first.output;
  expect_same_run(train("z2_to_z1", 2, "--dp 2 --batch 8 --zero 1 --resume " + checkpoint("z2_to_z1")),
                  single_process_batch16(), "--zero 2 dp 4 -> save -> --zero 1 dp 2");
}

// --zero alone is ZeRO-1 (before or after another flag), --zero N picks the stage.
TEST(ZeroFlag, AloneMeansOneAndANumberPicksTheStage) {
  for (const auto& [args, stage] : std::vector<std::pair<std::string, std::string>>{
           {"--zero", "ZeRO-1"}, {"--zero --dtype bf16", "ZeRO-1"}, {"--zero 2", "ZeRO-2"}}) {
    Result r = train("zero_flag", 1, "--batch 16 --steps 1 " + args);
    ASSERT_EQ(r.status, 0) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("sharded over dp (" + stage + ")"), std::string::npos) << args << "\n" << r.output;
  }
  Result off = train("zero_flag", 1, "--batch 16 --steps 1 --zero 0");
  ASSERT_EQ(off.status, 0) << off.output;
  EXPECT_EQ(off.output.find("sharded over dp"), std::string::npos) << off.output;
}

TEST(ZeroFlag, BadValuesStopWithTheValue) {
  for (const std::string v : {"5", "-1", "x"}) {
    Result r = train("zero_bad", 1, "--batch 16 --zero " + v);
    EXPECT_NE(r.status, 0) << v;
    EXPECT_NE(r.output.find("--zero must be an integer in [0, 3]"), std::string::npos) << v << "\n" << r.output;
    EXPECT_NE(r.output.find("got '" + v + "'"), std::string::npos) << v << "\n" << r.output;
  }
}
