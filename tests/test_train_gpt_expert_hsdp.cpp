// Expert parallelism under hybrid sharding (--ep with --zero 3 --dp-shard S): the ep group lies inside a
// shard group, the experts are sharded over that group's ranks holding the same ones and replicated over
// the replicas, as every shard is (parallel/process_group_manager.h; torchtitan's dp_shard_in_ep and
// dp_shard_mod_ep). dp 4, dp_shard 2, ep 2:
//     dp ranks        0    1   |  2    3       shard groups {0,1} {2,3}, ep groups the same
//     experts         0-1  2-3 |  0-1  2-3
//     expert shards   {0} {1} {2} {3}          one holder of each expert per shard group: kept whole
//     replicas        {0,2} {1,3}              each grad shard (dense or experts') averaged over them
// dp 8, dp_shard 4, ep 2 shards them too: expert shards {0,2} {1,3} {4,6} {5,7}, replicas {0,4} ... {3,7}.
#include <gtest/gtest.h>

#include <map>

#include "moe_runs.h"
#include "train_gpt_run.h"

using namespace loom;
using namespace loom::test;
using namespace loom::test::moe;

namespace {

const std::string kHsdp = "--dp 4 --dp-shard 2 --ep 2 --zero 3 ";

}  // namespace

TEST(TrainGptExpertHsdp, EqualsOneProcessWithTheExpertsWholeOrSharded) {
  // Every routing option, one process running the ranks' micro-batches one after the other.
  expect_same_run(train("eh_dp4", 4, kMoE + kRouting + kHsdp), train("eh_ref4", 1, kMoE + kRouting + "--grad-accum 4"),
                  kHsdp.c_str());
  // dp 8: each expert cut in two inside its shard group, and the two halves replicated.
  const std::string dp8 = "--dp 8 --dp-shard 4 --ep 2 --zero 3 --batch 2";
  const std::string moe = "--arch llama --experts 4 --experts-per-token 2 --router-aux-loss-coef 0.05 ";
  expect_same_run(train("eh_dp8", 8, moe + dp8), train("eh_ref8", 1, moe + "--batch 2 --grad-accum 8"), dp8.c_str());
}

// Saved at step 5 and resumed: the same bits at the same layout, within 1e-5 at one process. Only the first
// replica writes optimizer state, and its two ranks hold every expert's once: rank r its ep rank's experts.
TEST(TrainGptExpertHsdp, SaveResumesAtTheSameLayoutAndAtOneProcess) {
  const std::string flags = kMoE + "--shared-experts 1 --capacity-factor 1.0 --router-aux-loss-coef 0.05 ";
  Result saved;
  moe::expect_save_resumes("eh", flags, kHsdp, "--grad-accum 4", &saved, 4);
  std::map<int, int64_t> held;  // ep rank -> the elements of its experts (2e, 2e + 1 of each layer)
  for (const auto& [name, t] : saved.weights.tensors) {
    const size_t at = name.find(".moe.experts.");
    if (at != std::string::npos) held[std::stoi(name.substr(at + 13)) / 2] += t.numel();
  }
  ASSERT_EQ(held.size(), 2u);
  for (int rank = 0; rank < 4; ++rank) {
    const fs::path file = work_dir() / ("eh_first.step5.optim." + std::to_string(rank) + ".safetensors");
    ASSERT_EQ(fs::exists(file), rank < 2) << file << ": only the first replica (ranks 0, 1) writes";
    if (rank >= 2) continue;
    int64_t kept = 0;
    for (const auto& [key, t] : nn::load_safetensors(file.string()).tensors)
      if (key.rfind("exp_avg/", 0) == 0 && key.find(".moe.experts.") != std::string::npos) kept += t.numel();
    EXPECT_EQ(kept, held[rank]) << "rank " << rank << " keeps its ep rank's experts' state whole";
  }
}

// --export-hf gathers every expert (Mixtral's names), as one process's export does.
TEST(TrainGptExpertHsdp, ExportEqualsOneProcessExport) {
  const std::string flags = kMoE + "--capacity-factor 1.0 --router-aux-loss-coef 0.05 ";
  const Result hsdp = train_and_export("eh_export", 4, flags + kHsdp);
  expect_same_run(hsdp, train_and_export("eh_export_1", 1, flags + "--grad-accum 4"), (kHsdp + "--export-hf").c_str());
  bool has_every_expert = false;
  for (const auto& [name, t] : hsdp.weights.tensors)
    has_every_expert |= name == "model.layers.1.block_sparse_moe.experts.3.w2.weight";
  EXPECT_TRUE(has_every_expert);
}
