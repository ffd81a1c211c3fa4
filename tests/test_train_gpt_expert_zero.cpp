// ZeRO-1/2 with expert parallelism: the experts' optimizer state (fp32 main
// params, exp_avg, exp_avg_sq) sharded over their expert-dp group, as the
// dense params' is over dp (optim/distributed_optimizer.h). dp 4, ep 2: ep
// groups {0,1} {2,3}, expert-dp groups {0,2} {1,3} - each expert is held by two
// ranks, and each of them keeps half of its optimizer state.
#include <gtest/gtest.h>

#include <map>
#include <sstream>

#include "moe_runs.h"
#include "train_gpt_run.h"

using namespace loom;
using namespace loom::test;
using namespace loom::test::moe;

namespace {

const std::string kDp4Ep2 = "--dp 4 --ep 2 ";

// One process, the four ranks' micro-batches one after the other.
const Result& one_process_four_micro_batches() {
  static const Result r = train("ez_ref", 1, kMoE + kRouting + "--grad-accum 4");
  return r;
}

}  // namespace

TEST(TrainGptExpertZero, ZeroOneAndTwoShardingExpertsOverExpertDpEqualOneProcess) {
  const Result& ref = one_process_four_micro_batches();
  expect_same_run(train("ez_zero1", 4, kMoE + kRouting + kDp4Ep2 + "--zero 1"), ref, "--dp 4 --ep 2 --zero 1");
  // Small buckets: several expert buckets, each reduce-scattered (x 1 / ep) through ZeRO-2's scratches.
  expect_same_run(train("ez_zero2", 4, kMoE + kRouting + kDp4Ep2 + "--zero 2 --bucket-mb 0.01"), ref,
                  "--dp 4 --ep 2 --zero 2 --bucket-mb 0.01");
}

// Gradient accumulation under ZeRO-2: every micro-batch reduce-scatters the experts' buffer too, and the
// shards add up. Dropless routing without an aux loss is per token: any split of the 16 sequences is one
// process's --batch 16.
TEST(TrainGptExpertZero, ZeroTwoWithGradientAccumulationEqualsOneProcess) {
  const std::string moe = "--arch llama --experts 4 --experts-per-token 2 ";
  expect_same_run(train("ez_zero2_accum", 4, moe + kDp4Ep2 + "--zero 2 --batch 2 --grad-accum 2"),
                  train("ez_accum_ref", 1, moe + "--batch 16"), "--dp 4 --ep 2 --zero 2 --batch 2 --grad-accum 2");
}

// bf16 params, fp32 main params: each rank rounds its own shard of the experts into the param buffer and
// the all-gather over expert-dp hands it to the other. ZeRO-2 is ZeRO-1 bit for bit (the same shards), and
// ZeRO-1 and ZeRO-3 are the replicated optimizer's run (no --zero) within 1e-5 (measured: the same bits).
// (Against one process bf16 drifts by its rounding, params ~4e-2 after 10 steps: the sums' order differs.)
TEST(TrainGptExpertZero, Bf16ShardsEqualTheReplicatedOptimizer) {
  const std::string flags = kMoE + kDp4Ep2 + "--dtype bf16 ";
  const Result replicated = train("ez_bf16_zero0", 4, flags);
  const Result zero1 = train("ez_bf16_zero1", 4, flags + "--zero 1");
  const Result zero2 = train("ez_bf16_zero2", 4, flags + "--zero 2");
  expect_bit_identical(zero2, zero1, "bf16 --dp 4 --ep 2 --zero 2", "--zero 1");
  expect_same_run(zero1, replicated, "bf16 --dp 4 --ep 2 --zero 1 vs no ZeRO", 1e-5, 1e-5, 1e-5);
  expect_same_run(train("ez_bf16_zero3", 4, flags + "--zero 3"), replicated, "bf16 --dp 4 --ep 2 --zero 3 vs no ZeRO",
                  1e-5, 1e-5, 1e-5);
}

TEST(TrainGptExpertZero, SaveResumesAtTheSameLayoutAndAtOneProcess) {
  const std::string flags = kMoE + "--shared-experts 1 --capacity-factor 1.0 --router-aux-loss-coef 0.05 ";
  moe::expect_save_resumes("ez_zero1", flags, kDp4Ep2 + "--zero 1", "--grad-accum 4", nullptr, 4);
  moe::expect_save_resumes("ez_zero2", flags, kDp4Ep2 + "--zero 2", "--grad-accum 4", nullptr, 4);
}

// ZeRO-3 (parallel/data_parallel/fully_sharded.h): each block's experts are a unit of their own, cut over
// expert-dp, gathered with the block and reduce-scattered over expert-dp x 1 / ep.
TEST(TrainGptExpertZero, ZeroThreeShardingExpertsOverExpertDpEqualsOneProcess) {
  expect_same_run(train("ez_zero3", 4, kMoE + kRouting + kDp4Ep2 + "--zero 3"), one_process_four_micro_batches(),
                  "--dp 4 --ep 2 --zero 3");
  // ep 4: expert-dp groups of one rank, each expert whole on its rank.
  expect_same_run(train("ez_zero3_ep4", 4, kMoE + kRouting + "--dp 4 --ep 4 --zero 3 --zero3-prefetch off"),
                  one_process_four_micro_batches(), "--dp 4 --ep 4 --zero 3 --zero3-prefetch off");
}

TEST(TrainGptExpertZero, ZeroThreeSavesResumesAtTheSameLayoutAndAtOneProcess) {
  const std::string flags = kMoE + "--shared-experts 1 --capacity-factor 1.0 --router-aux-loss-coef 0.05 ";
  moe::expect_save_resumes("ez_zero3", flags, kDp4Ep2 + "--zero 3", "--grad-accum 4", nullptr, 4);
}

namespace {

// What each rank holds, read off the checkpoint it wrote (each rank writes the optimizer state it keeps,
// optim/checkpoint.h): of the experts of its ep rank (H elements), an expert-dp rank keeps its half of the
// expert buffer, padded to a multiple of 2 x 64: within 64 elements of H / 2, the two halves H together.
// Replicated (the experts' state whole on both), each would hold H.
// (ZeRO-3: each block's experts' unit padded to a multiple of 2, each half within one element.)
void expect_each_rank_keeps_one_expert_dp_shard(const std::string& zero) {
  const Result r = train("ez_state", 4, kMoE + kDp4Ep2 + zero + " --steps 2");
  ASSERT_EQ(r.status, 0) << r.output;
  const int experts = 4, ep = 2;
  // H: the elements of ep rank e's experts (experts [2e, 2e + 2) of every layer), from the model file.
  std::map<int, int64_t> held;
  for (const auto& [name, t] : r.weights.tensors) {
    const size_t at = name.find(".moe.experts.");
    if (at == std::string::npos) continue;
    const int expert = std::stoi(name.substr(at + 13));
    held[expert / (experts / ep)] += t.numel();
  }
  ASSERT_EQ(held.size(), 2u);
  std::map<int, int64_t> kept;  // world rank -> expert elements of exp_avg in its shard file
  for (int rank = 0; rank < 4; ++rank) {
    const fs::path file = work_dir() / ("ez_state.step2.optim." + std::to_string(rank) + ".safetensors");
    ASSERT_TRUE(fs::exists(file)) << file;
    for (const auto& [key, t] : nn::load_safetensors(file.string()).tensors)
      if (key.rfind("exp_avg/", 0) == 0 && key.find(".moe.experts.") != std::string::npos) kept[rank] += t.numel();
  }
  for (int rank = 0; rank < 4; ++rank) {
    const int64_t h = held[rank % ep];  // dp rank = ep rank + ep x expert-dp rank
    EXPECT_LT(std::abs(double(kept[rank]) - double(h) / 2), 64.0) << "rank " << rank << " keeps " << kept[rank]
                                                                  << " of its experts' " << h << " elements";
  }
  EXPECT_EQ(kept[0] + kept[2], held[0]) << "ep rank 0's experts, over expert-dp ranks 0 and 2";
  EXPECT_EQ(kept[1] + kept[3], held[1]) << "ep rank 1's experts, over expert-dp ranks 1 and 3";
}

}  // namespace

TEST(TrainGptExpertZero, EachRankKeepsOneExpertDpShardOfItsExpertsState) {
  for (const char* zero : {"--zero 1", "--zero 3"}) {
    SCOPED_TRACE(zero);
    expect_each_rank_keeps_one_expert_dp_shard(zero);
  }
}
