// ProcessGroupManager on real ranks (CTest runs it on 1 and 4): each group's
// members, gathered over the group itself, are the ranks the documented
// layout says (tp fastest, then dp, then pp); an invalid grid throws on every
// rank before any collective.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "group_members.h"
#include "parallel/process_group_manager.h"

using namespace loom;
using namespace loom::parallel;

namespace {

using enum ProcessGrid::Axes;  // kTp, kCp, kDp, kPp, ...: the axes a group's ranks differ along

// Every group of pgm has the members the grid arithmetic promises.
void expect_groups_match_grid(ProcessGroupManager& pgm) {
  const ProcessGrid& g = pgm;
  int r = pgm.global_rank;
  EXPECT_EQ(members(pgm.tp_group()), g.ranks_along(r, kTp));
  EXPECT_EQ(members(pgm.dp_group()), g.ranks_along(r, kDp));
  EXPECT_EQ(members(pgm.pp_group()), g.ranks_along(r, kPp));
  EXPECT_EQ(members(pgm.model_parallel_group()), g.ranks_along(r, kPp | kTp));
  if (pgm.in_embedding_group()) {
    EXPECT_EQ(members(pgm.embedding_group()), g.embedding_group_ranks(r));
  } else {
    EXPECT_EQ(g.embedding_group_ranks(r), Ranks{});
  }
  EXPECT_EQ(pgm.tp_group().rank(), pgm.tp_rank);
  EXPECT_EQ(pgm.dp_group().rank(), pgm.dp_rank);
  EXPECT_EQ(pgm.pp_group().rank(), pgm.pp_rank);
  if (pgm.cp_size > 1) {
    EXPECT_EQ(members(pgm.cp_group()), g.ranks_along(r, kCp));
    EXPECT_EQ(pgm.cp_group().rank(), pgm.cp_rank);
  } else {  // no extra communicator: dp x cp is the dp group
    EXPECT_EQ(&pgm.dp_cp_group(), &pgm.dp_group());
  }
  EXPECT_EQ(members(pgm.dp_cp_group()), g.ranks_along(r, kDp | kCp));
  if (pgm.hybrid_sharded()) {
    EXPECT_EQ(members(pgm.dp_shard_cp_group()), g.ranks_along(r, kDpShard | kCp));
    EXPECT_EQ(members(*pgm.dp_replicate_group()), g.ranks_along(r, kDpReplicate));
    EXPECT_EQ(pgm.dp_replicate_group()->rank(), pgm.dp_replicate_rank);
    EXPECT_EQ(members(pgm.instance_group()), g.ranks_along(r, kTp | kCp | kDpShard | kPp));
  } else {  // ZeRO-3 shards over dp x cp, one replica: the world
    EXPECT_EQ(&pgm.dp_shard_cp_group(), &pgm.dp_cp_group());
    EXPECT_EQ(pgm.dp_replicate_group(), nullptr);
    EXPECT_EQ(&pgm.instance_group(), &pgm.world());
  }
  if (pgm.ep_size > 1) {
    EXPECT_EQ(members(pgm.ep_group()), g.ranks_along(r, kEp));
    EXPECT_EQ(pgm.ep_group().rank(), pgm.ep_rank);
    EXPECT_EQ(members(pgm.expert_dp_group()), g.ranks_along(r, kExpertDp | kCp));
    EXPECT_EQ(members(pgm.expert_dp_shard_cp_group()), g.ranks_along(r, kExpertDpShard | kCp));
    EXPECT_EQ(members(pgm.ep_model_parallel_group()), g.ranks_along(r, kEp | kTp | kPp));
  } else {  // the experts' gradients are reduced over dp; every rank holds every expert
    EXPECT_EQ(&pgm.expert_dp_group(), &pgm.dp_group());
    EXPECT_THROW(pgm.ep_group(), Error);
  }
}

}  // namespace

// dp 2 × pp 2 on 4 ranks: rank = dp_rank + 2 * pp_rank.
TEST(ProcessGroupManager, Dp2Pp2OnFourRanks) {
  // CTest also runs this binary on 1 rank.
  if (parallel::world().size() != 4) GTEST_SKIP() << "dp 2 x pp 2 needs 4 ranks";
  ProcessGroupManager pgm(2, 2);
  int r = pgm.global_rank;
  EXPECT_EQ(pgm.dp_rank, r % 2);
  EXPECT_EQ(pgm.pp_rank, r / 2);
  EXPECT_EQ(pgm.is_first_stage(), r < 2);
  EXPECT_EQ(pgm.is_last_stage(), r >= 2);
  EXPECT_EQ(members(pgm.dp_group()), r < 2 ? (Ranks{0, 1}) : (Ranks{2, 3}));
  EXPECT_EQ(members(pgm.pp_group()), r % 2 == 0 ? (Ranks{0, 2}) : (Ranks{1, 3}));
  ASSERT_TRUE(pgm.in_embedding_group());
  EXPECT_EQ(members(pgm.embedding_group()), r % 2 == 0 ? (Ranks{0, 2}) : (Ranks{1, 3}));
  expect_groups_match_grid(pgm);
}

// pp = world size: only the two end stages share the embedding group.
TEST(ProcessGroupManager, AllPipeline) {
  int S = parallel::world().size();
  ProcessGroupManager pgm(1, S);
  int r = pgm.global_rank;
  EXPECT_EQ(pgm.pp_rank, r);
  EXPECT_EQ(pgm.dp_size, 1);
  EXPECT_EQ(pgm.in_embedding_group(), r == 0 || r == S - 1);
  if (!pgm.in_embedding_group()) {
    try {
      pgm.embedding_group();
      ADD_FAILURE() << "a middle stage has no embedding group";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("a middle pipeline stage has no embedding group"), std::string::npos);
    }
  }
  expect_groups_match_grid(pgm);
}

TEST(ProcessGroupManager, AllDataParallel) {
  int S = parallel::world().size();
  ProcessGroupManager pgm(S, 1);
  EXPECT_EQ(pgm.dp_rank, pgm.global_rank);
  EXPECT_TRUE(pgm.is_first_stage() && pgm.is_last_stage());
  expect_groups_match_grid(pgm);
}

// Every rank throws the same message, and since no collective was started the
// world is still in step afterwards.
TEST(ProcessGroupManager, InvalidGridFailsOnEveryRankBeforeAnyCollective) {
  int S = parallel::world().size();
  std::string msg = "(no error)";
  try {
    ProcessGroupManager pgm(S + 1, 1);
  } catch (const Error& e) {
    msg = e.what();
  }
  std::string expected = "world size " + std::to_string(S) + " is not dp " + std::to_string(S + 1) + " × pp 1";
  EXPECT_NE(msg.find(expected), std::string::npos) << msg;
  Tensor t = ones({1});
  parallel::world().all_reduce(t);
  EXPECT_EQ(t.item<float>(), float(S));
}

// dp 1 × pp 2 × tp 2 on 4 ranks: rank = tp_rank + 2 * pp_rank. The model-
// parallel group is the whole world (pp × tp), the embedding group pairs the
// same tp rank of the first and the last stage.
TEST(ProcessGroupManager, Pp2Tp2OnFourRanks) {
  if (parallel::world().size() != 4) GTEST_SKIP() << "a 4-rank grid";
  ProcessGroupManager pgm(1, 2, 2);
  int r = pgm.global_rank;
  EXPECT_EQ(pgm.tp_rank, r % 2);
  EXPECT_EQ(pgm.pp_rank, r / 2);
  EXPECT_EQ(members(pgm.tp_group()), r < 2 ? (Ranks{0, 1}) : (Ranks{2, 3}));
  EXPECT_EQ(members(pgm.pp_group()), r % 2 == 0 ? (Ranks{0, 2}) : (Ranks{1, 3}));
  EXPECT_EQ(members(pgm.model_parallel_group()), (Ranks{0, 1, 2, 3}));
  EXPECT_EQ(members(pgm.embedding_group()), r % 2 == 0 ? (Ranks{0, 2}) : (Ranks{1, 3}));
  EXPECT_EQ(pgm.dp_group().size(), 1);
  expect_groups_match_grid(pgm);
}

// dp 2 × tp 2: the tp pairs {0,1} {2,3} are neighbours, the dp pairs {0,2} {1,3}.
TEST(ProcessGroupManager, Dp2Tp2OnFourRanks) {
  if (parallel::world().size() != 4) GTEST_SKIP() << "a 4-rank grid";
  ProcessGroupManager pgm(2, 1, 2);
  int r = pgm.global_rank;
  EXPECT_EQ(members(pgm.tp_group()), r < 2 ? (Ranks{0, 1}) : (Ranks{2, 3}));
  EXPECT_EQ(members(pgm.dp_group()), r % 2 == 0 ? (Ranks{0, 2}) : (Ranks{1, 3}));
  EXPECT_EQ(members(pgm.model_parallel_group()), r < 2 ? (Ranks{0, 1}) : (Ranks{2, 3}));
  expect_groups_match_grid(pgm);
}

// dp 2 × cp 2: the cp pairs {0,1} {2,3} are neighbours (they pass K/V blocks
// every layer); gradients are averaged over all four.
TEST(ProcessGroupManager, Dp2Cp2OnFourRanks) {
  if (parallel::world().size() != 4) GTEST_SKIP() << "a 4-rank grid";
  ProcessGroupManager pgm(/*dp=*/2, /*pp=*/1, /*tp=*/1, /*cp=*/2);
  int r = pgm.global_rank;
  EXPECT_EQ(members(pgm.cp_group()), r < 2 ? (Ranks{0, 1}) : (Ranks{2, 3}));
  EXPECT_EQ(members(pgm.dp_group()), r % 2 == 0 ? (Ranks{0, 2}) : (Ranks{1, 3}));
  EXPECT_EQ(members(pgm.dp_cp_group()), (Ranks{0, 1, 2, 3}));
  expect_groups_match_grid(pgm);
}

// HSDP, dp 2 × pp 2 with dp_shard 1 on 4 ranks: each rank shards over itself,
// the two dp ranks of a stage are replicas, and one replica's ranks (the
// instance) are its two stages.
TEST(ProcessGroupManager, HybridShardingGroupsOnFourRanks) {
  if (parallel::world().size() != 4) GTEST_SKIP() << "a 4-rank grid";
  ProcessGroupManager pgm(/*dp=*/2, /*pp=*/2, /*tp=*/1, /*cp=*/1, parallel::world(), /*dp_shard=*/1);
  int r = pgm.global_rank;
  ASSERT_TRUE(pgm.hybrid_sharded());
  EXPECT_EQ(members(pgm.dp_shard_cp_group()), (Ranks{r}));
  ASSERT_NE(pgm.dp_replicate_group(), nullptr);
  EXPECT_EQ(members(*pgm.dp_replicate_group()), r < 2 ? (Ranks{0, 1}) : (Ranks{2, 3}));
  EXPECT_EQ(members(pgm.instance_group()), r % 2 == 0 ? (Ranks{0, 2}) : (Ranks{1, 3}));
  expect_groups_match_grid(pgm);
}

// dp 2 × cp 2, ep 2 on 4 ranks (rank = cp_rank + 2 dp_rank): a cp rank's two dp ranks split the
// experts; an expert's holders are one dp rank with its two cp ranks (each saw part of every sequence).
TEST(ProcessGroupManager, ExpertGroupsWithContextParallelOnFourRanks) {
  if (parallel::world().size() != 4) GTEST_SKIP() << "a 4-rank grid";
  ProcessGroupManager pgm(/*dp=*/2, /*pp=*/1, /*tp=*/1, /*cp=*/2, parallel::world(), /*dp_shard=*/0, /*ep=*/2);
  int r = pgm.global_rank;
  EXPECT_EQ(members(pgm.ep_group()), r % 2 == 0 ? (Ranks{0, 2}) : (Ranks{1, 3}));
  EXPECT_EQ(members(pgm.expert_dp_group()), r < 2 ? (Ranks{0, 1}) : (Ranks{2, 3}));
  expect_groups_match_grid(pgm);
}

// HSDP with ep, dp 4, dp_shard 2, ep 2 on 4 ranks: ep {0,1} {2,3} inside the shard groups; one rank of each
// shard group holds each expert (expert shard groups of one), replicated over {0,2} {1,3}.
TEST(ProcessGroupManager, HybridShardingWithExpertGroupsOnFourRanks) {
  if (parallel::world().size() != 4) GTEST_SKIP() << "a 4-rank grid";
  ProcessGroupManager pgm(/*dp=*/4, /*pp=*/1, /*tp=*/1, /*cp=*/1, parallel::world(), /*dp_shard=*/2, /*ep=*/2);
  int r = pgm.global_rank;
  EXPECT_EQ(members(pgm.ep_group()), r < 2 ? (Ranks{0, 1}) : (Ranks{2, 3}));
  EXPECT_EQ(members(pgm.expert_dp_shard_cp_group()), (Ranks{r}));
  EXPECT_EQ(members(*pgm.dp_replicate_group()), r % 2 == 0 ? (Ranks{0, 2}) : (Ranks{1, 3}));
  expect_groups_match_grid(pgm);
}
