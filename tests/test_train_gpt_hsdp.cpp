// --zero 3 --dp-shard N (hybrid sharding, HSDP: FSDP2's and torchtitan's
// data_parallel_shard_degree x data_parallel_replicate_degree) in train_gpt
// against one process on the same global batch (tests/train_gpt_run.h: the
// tolerances, how runs are launched). ZeRO-3 shards over groups of N dp ranks
// and each shard's reduce-scattered gradient is averaged over its dp / N
// replicas (parallel/data_parallel/fully_sharded.h): the dp average of one
// process's gradient, up to the order of float additions.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/train_gpt_run.h"

using namespace loom;
using namespace loom::test;

namespace {

const std::string kHsdp = "--dp 4 --dp-shard 2 --batch 4 --zero 3";

}  // namespace

// dp 4 = 2 shard groups of 2: each unit cut in 2 shards, each shard on 2 ranks.
TEST(TrainGptHsdp, FourRanksInTwoShardGroupsMatchOneProcess) {
  expect_same_run(train("hsdp_dp4_shard2", 4, kHsdp), single_process_batch16(), kHsdp.c_str());
}

// dp 2 x tp 2, shard groups of 1: every dp rank a whole replica of its tp
// shards, the gradients averaged over the replicate group alone (DDP's
// numbers through ZeRO-3's machinery); the grad norm over one replica's
// ranks (tp), not the world.
TEST(TrainGptHsdp, WithTensorParallelMatchesOneProcess) {
  const std::string args = "--dp 2 --dp-shard 1 --tp 2 --batch 8 --zero 3";
  expect_same_run(train("hsdp_dp2_tp2", 4, args), single_process_batch16(), args.c_str());
}

// dp 2 x pp 2 (untied: ZeRO-3's pipeline rule), shard groups of 1: each
// stage's units replicated over dp.
TEST(TrainGptHsdp, WithPipelineMatchesOneProcess) {
  const std::string args = "--dp 2 --dp-shard 1 --pp 2 --microbatches 2 --batch 4 --untied --zero 3";
  expect_same_run(train("hsdp_dp2_pp2", 4, args), train("hsdp_one_untied", 1, "--batch 16 --untied"), args.c_str());
}

// Stopped at step 5 with --save and resumed with the same flags: the same
// bits as the straight run. Only the first replica writes its shard group's
// optimizer shards (the replicas' are the same bits).
TEST(TrainGptHsdp, ResumeIsBitExactAndOnlyTheFirstReplicaWrites) {
  Result straight = train("hsdp_straight", 4, kHsdp);
  Result first = train("hsdp_resumed", 4, kHsdp + " --stop-at 5");
  ASSERT_EQ(first.status, 0) << first.output;
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(fs::exists(work_dir() / str("hsdp_resumed.step5.optim.", r, ".safetensors")), r < 2) << "rank " << r;
  Result resumed = train("hsdp_resumed", 4, kHsdp + " --resume " + checkpoint("hsdp_resumed"));
  expect_bit_identical(resumed, straight, "--dp 4 --dp-shard 2 --zero 3 stopped at 5 and resumed", "the straight run");
}

// Saved under HSDP, resumed on one process: the first replica's shards are
// the whole optimizer state.
TEST(TrainGptHsdp, CheckpointResumesOnOneProcess) {
  Result first = train("hsdp_to_one", 4, kHsdp + " --stop-at 5");
  ASSERT_EQ(first.status, 0) << first.output;
  expect_same_run(train("hsdp_to_one", 1, "--batch 16 --resume " + checkpoint("hsdp_to_one")),
                  single_process_batch16(), "--dp 4 --dp-shard 2 --zero 3 -> save -> one process");
}

TEST(TrainGptHsdp, ExportEqualsOneProcessExport) {
  expect_same_run(train_and_export("hsdp_export", 4, kHsdp), train_and_export("hsdp_one_export", 1, "--batch 16"),
                  (kHsdp + " --export-hf").c_str());
}

TEST(TrainGptHsdp, WithoutZero3OrADivisorOfDpIsRefusedBeforeTraining) {
  for (const auto& [args, message] :
       {std::pair{"--dp 4 --dp-shard 2 --batch 4 --zero 1",
                  "--dp-shard 2 shards ZeRO-3's params over groups of dp ranks (hybrid sharding); it needs --zero 3 "
                  "(got --zero 1"},
        std::pair{"--dp 4 --dp-shard 3 --batch 4 --zero 3", "--dp-shard 3 must divide --dp 4"}}) {
    Result r = train("hsdp_refused", 4, args, /*save=*/false);
    EXPECT_NE(r.status, 0) << args;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("step     1"), std::string::npos) << "refused before training\n" << r.output;
  }
}

// --memory-json under HSDP (optim/memory_report.h): the shards are 1/2 of the
// model, not 1/4 - (2 + 4 + 4 + 8) / 2 bytes a bf16 parameter, as at --dp 2 -
// within 1% (padding, AdamW's step counters), and the gathered working set to the byte.
TEST(TrainGptHsdp, LedgerShardsOverTheShardGroup) {
  const fs::path json_path = work_dir() / "hsdp_ledger.json";
  Result r = train("hsdp_ledger", 4, kHsdp + " --dtype bf16 --memory-json " + json_path.string());
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream f(json_path);
  const nlohmann::json ledger = nlohmann::json::parse(f);
  ASSERT_EQ(ledger["ranks"].size(), 4u);
  for (const auto& rank : ledger["ranks"]) {
    const double n = rank["num_params"].get<double>();
    double total = 0;
    for (const char* kind : {"params", "grads", "optimizer"}) {
      const double measured = rank[kind]["measured"].get<double>(), predicted = rank[kind]["predicted"].get<double>();
      EXPECT_NEAR(measured, predicted, 0.01 * predicted) << "rank " << rank["rank"] << " " << kind;
      total += measured;
    }
    EXPECT_NEAR(total / n, 18.0 / 2, 0.01 * 18.0 / 2) << "rank " << rank["rank"];
    EXPECT_EQ(rank["comm"]["measured"].get<int64_t>(), rank["comm"]["predicted"].get<int64_t>()) << "rank " << rank["rank"];
    std::printf("[ measured ] %s --dtype bf16 rank %d: %.3f bytes/param (formula 9.00)\n", kHsdp.c_str(),
                rank["rank"].get<int>(), total / n);
  }
}

// fp16 with an inf put into rank 0's gradient shard at step 3: found_inf is
// reduced over one replica's ranks, so the inf is put into every replica of
// rank 0's shard (where a real overflow's inf would have been carried by the
// all-reduce over the replicas); every rank skips the step, as ZeRO-3 over all
// of dp does. Put into rank 0 alone, ranks 2 and 3 stepped while 0 and 1 skipped.
TEST(TrainGptHsdp, Fp16WithAnOverflowSkipsOnEveryRankAsZero3Does) {
  const std::string cfg = "--dp 4 --batch 4 --dtype fp16 --inject-overflow 3 --zero 3";
  Result hsdp = train("hsdp_fp16", 4, cfg + " --dp-shard 2");
  expect_same_run(hsdp, train("zero3_dp4_fp16", 4, cfg), "--dp 4 --dp-shard 2 --zero 3 --dtype fp16");
  ASSERT_EQ(hsdp.log.size(), 10u);
  EXPECT_NE(hsdp.log[3].find("\"skipped\": true"), std::string::npos) << hsdp.log[3];
}
