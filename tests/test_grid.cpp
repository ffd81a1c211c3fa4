// The process-group grid's arithmetic (parallel/process_group_manager.h):
// validation messages, the rank layout (tp fastest, then dp, then pp) and the
// members of every group, all without communication. The same layout is
// checked on 4 real ranks by tests/mpi/test_grid_mpi.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "parallel/process_group_manager.h"

using namespace loom;
using namespace loom::parallel;

namespace {

std::string error_of(int world, int dp, int pp, int tp = 1) {
  try {
    ProcessGrid g(world, dp, pp, tp);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

using Ranks = std::vector<int>;
using enum ProcessGrid::Axes;  // kTp, kCp, kDp, kPp, ...: the axes a group's ranks differ along

// A rank's (tp, cp, dp, pp) coordinates.
Ranks coords_of(const ProcessGrid& g, int rank) {
  const ProcessGrid::Coords c = g.coords(rank);
  return {c.tp_rank, c.cp_rank, c.dp_rank, c.pp_rank};
}

}  // namespace

TEST(ProcessGrid, RejectsAWorldThatIsNotTheProductOfTheSizes) {
  EXPECT_NE(error_of(4, 3, 1).find("world size 4 is not dp 3 × pp 1"), std::string::npos) << error_of(4, 3, 1);
  EXPECT_NE(error_of(4, 2, 3).find("world size 4 is not dp 2 × pp 3"), std::string::npos);
  EXPECT_NE(error_of(8, 2, 2, 3).find("world size 8 is not dp 2 × pp 2 × tp 3"), std::string::npos);
  EXPECT_NE(error_of(1, 2, 1).find("mpirun -np 2"), std::string::npos);
  EXPECT_NE(error_of(4, 0, 4).find("sizes must be >= 1"), std::string::npos);
  EXPECT_NE(error_of(4, 4, -1).find("sizes must be >= 1"), std::string::npos);
  EXPECT_EQ(error_of(4, 2, 2), "(no error)");
  EXPECT_EQ(error_of(6, 3, 2), "(no error)");
}

// dp 2 × pp 2:   dp_rank 0  dp_rank 1
//   pp_rank 0       0          1
//   pp_rank 1       2          3
TEST(ProcessGrid, Dp2Pp2Layout) {
  ProcessGrid g(4, 2, 2);
  int expected_dp[] = {0, 1, 0, 1}, expected_pp[] = {0, 0, 1, 1};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(g.coords(r).dp_rank, expected_dp[r]) << r;
    EXPECT_EQ(g.coords(r).pp_rank, expected_pp[r]) << r;
    EXPECT_EQ(g.coords(r).tp_rank, 0);
  }
  EXPECT_EQ(g.ranks_along(0, kDp), (Ranks{0, 1}));
  EXPECT_EQ(g.ranks_along(3, kDp), (Ranks{2, 3}));
  EXPECT_EQ(g.ranks_along(0, kPp), (Ranks{0, 2}));
  EXPECT_EQ(g.ranks_along(3, kPp), (Ranks{1, 3}));
  EXPECT_EQ(g.ranks_along(1, kPp | kTp), (Ranks{1, 3}));
  EXPECT_EQ(g.embedding_group_ranks(2), (Ranks{0, 2}));
}

// dp 2 × pp 3: stage 1 (ranks 2, 3) is a middle stage, outside the embedding group.
TEST(ProcessGrid, Dp2Pp3MiddleStageHasNoEmbeddingGroup) {
  ProcessGrid g(6, 2, 3);
  EXPECT_EQ(g.ranks_along(1, kPp), (Ranks{1, 3, 5}));
  EXPECT_EQ(g.ranks_along(4, kDp), (Ranks{4, 5}));
  EXPECT_EQ(g.embedding_group_ranks(0), (Ranks{0, 4}));
  EXPECT_EQ(g.embedding_group_ranks(5), (Ranks{1, 5}));
  EXPECT_EQ(g.embedding_group_ranks(2), Ranks{});
  EXPECT_EQ(g.embedding_group_ranks(3), Ranks{});
}

// tp varies fastest: dp 2 × pp 2 × tp 2 puts the two tp ranks of each (dp, pp) side by side.
TEST(ProcessGrid, TensorParallelAxisVariesFastest) {
  ProcessGrid g(8, 2, 2, 2);
  EXPECT_EQ(coords_of(g, 3), (Ranks{/*tp=*/1, /*cp=*/0, /*dp=*/1, /*pp=*/0}));
  EXPECT_EQ(coords_of(g, 4), (Ranks{0, 0, 0, 1}));
  EXPECT_EQ(g.ranks_along(5, kDp), (Ranks{5, 7}));
  EXPECT_EQ(g.ranks_along(5, kPp), (Ranks{1, 5}));
  EXPECT_EQ(g.ranks_along(2, kPp | kTp), (Ranks{2, 3, 6, 7}));
}

TEST(ProcessGrid, PipelineOfOneStageIsItsOwnEmbeddingGroup) {
  ProcessGrid g(3, 3, 1);
  EXPECT_EQ(g.embedding_group_ranks(1), Ranks{1});
  EXPECT_EQ(g.ranks_along(2, kPp), Ranks{2});
  EXPECT_EQ(g.ranks_along(2, kDp), (Ranks{0, 1, 2}));
}

// Megatron's order tp-cp-dp-pp: tp 2 × cp 2 × dp 2 (pp 1) on 8 ranks.
//   rank  0 1 2 3 4 5 6 7
//   tp    0 1 0 1 0 1 0 1
//   cp    0 0 1 1 0 0 1 1
//   dp    0 0 0 0 1 1 1 1
TEST(ProcessGrid, ContextParallelAxisSitsBetweenTpAndDp) {
  ProcessGrid g(8, /*dp=*/2, /*pp=*/1, /*tp=*/2, /*cp=*/2);
  EXPECT_EQ(coords_of(g, 5), (Ranks{/*tp=*/1, /*cp=*/0, /*dp=*/1, /*pp=*/0}));
  EXPECT_EQ(g.coords(6).cp_rank, 1);
  EXPECT_EQ(g.coords(6).dp_rank, 1);
  EXPECT_EQ(g.coords(6).tp_rank, 0);
  EXPECT_EQ(g.ranks_along(5, kCp), (Ranks{5, 7}));
  EXPECT_EQ(g.ranks_along(5, kDp), (Ranks{1, 5}));
  EXPECT_EQ(g.ranks_along(6, kTp), (Ranks{6, 7}));
  // Gradients are averaged over every replica and every cp rank of one (pp, tp) coordinate.
  EXPECT_EQ(g.ranks_along(5, kDp | kCp), (Ranks{1, 3, 5, 7}));
  EXPECT_EQ(g.ranks_along(2, kPp | kTp), (Ranks{2, 3}));
  try {
    ProcessGrid bad(4, 2, 1, 1, 3);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("world size 4 is not dp 2 × pp 1 × cp 3 (= 6)"), std::string::npos)
        << e.what();
  }
}

// HSDP, dp 4 × cp 2 with dp_shard 2 (rank = tp + cp + 2 dp): dp ranks {0,1}
// and {2,3} shard (with their cp ranks), the dp ranks 0 and 2, 1 and 3 are
// replicas; one replica's ranks hold every shard once.
//   dp_rank       0      1      2      3
//   cp 0 / cp 1   0 / 1  2 / 3  4 / 5  6 / 7
TEST(ProcessGrid, HybridShardingSplitsDpIntoShardAndReplicateGroups) {
  ProcessGrid g(8, 4, 1, 1, 2, /*dp_shard=*/2);
  EXPECT_EQ(g.coords(6).dp_rank, 3);  // dp_shard rank 1 of dp_replicate rank 1
  EXPECT_EQ(g.coords(6).dp_replicate_rank, 1);
  EXPECT_EQ(g.coords(3).dp_replicate_rank, 0);  // dp_rank 1
  EXPECT_EQ(g.coords(6).global_rank, 6);
  EXPECT_EQ(g.ranks_along(0, kDpShard | kCp), (Ranks{0, 1, 2, 3}));
  EXPECT_EQ(g.ranks_along(5, kDpShard | kCp), (Ranks{4, 5, 6, 7}));
  EXPECT_EQ(g.ranks_along(0, kDpReplicate), (Ranks{0, 4}));
  EXPECT_EQ(g.ranks_along(3, kDpReplicate), (Ranks{3, 7}));
  EXPECT_EQ(g.ranks_along(7, kTp | kCp | kDpShard | kPp), (Ranks{4, 5, 6, 7}));  // no tp or pp here: the shard group itself
  EXPECT_EQ(g.ranks_along(0, kDp | kCp), (Ranks{0, 1, 2, 3, 4, 5, 6, 7}));  // the whole dp x cp is unchanged
  // Without --dp-shard the shard group is dp x cp and there is one replica.
  ProcessGrid plain(8, 4, 1, 1, 2);
  EXPECT_EQ(plain.ranks_along(0, kDpShard | kCp), plain.ranks_along(0, kDp | kCp));
  EXPECT_EQ(plain.ranks_along(5, kDpReplicate), (Ranks{5}));
  // dp 4 x pp 2, dp_shard 2: the instance spans the stages of one replica.
  ProcessGrid pp(8, 4, 2, 1, 1, 2);
  EXPECT_EQ(pp.ranks_along(0, kTp | kCp | kDpShard | kPp), (Ranks{0, 1, 4, 5}));
  EXPECT_EQ(pp.ranks_along(5, kDpReplicate), (Ranks{5, 7}));
}

TEST(ProcessGrid, RejectsADpShardThatDoesNotDivideDp) {
  try {
    ProcessGrid g(4, 4, 1, 1, 1, 3);
    FAIL() << "dp_shard 3 of dp 4 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--dp-shard 3 does not divide --dp 4"), std::string::npos) << e.what();
  }
}

// Expert parallelism cuts dp as dp_rank = ep_rank + ep * expert_dp_rank, within each (tp, cp, pp) coordinate.
TEST(ProcessGrid, ExpertParallelCutsDpIntoEpAndExpertDpGroups) {
  // dp 4 x pp 2, ep 2 on 8 ranks: rank = dp_rank + 4 pp_rank.
  const ProcessGrid g(8, 4, 2, 1, 1, 0, /*ep=*/2);
  EXPECT_EQ(g.ranks_along(0, kEp), (Ranks{0, 1}));
  EXPECT_EQ(g.ranks_along(3, kEp), (Ranks{2, 3}));
  EXPECT_EQ(g.ranks_along(5, kEp), (Ranks{4, 5}));
  EXPECT_EQ(g.ranks_along(0, kExpertDp | kCp), (Ranks{0, 2}));
  EXPECT_EQ(g.ranks_along(5, kExpertDp | kCp), (Ranks{5, 7}));
  EXPECT_EQ(g.ranks_along(6, kExpertDp | kCp), (Ranks{4, 6}));
  // tp 2 x dp 4, ep 4: rank = tp_rank + 2 dp_rank; one ep group per tp rank, expert-dp groups of one.
  const ProcessGrid t(8, 4, 1, 2, 1, 0, /*ep=*/4);
  EXPECT_EQ(t.ranks_along(3, kEp), (Ranks{1, 3, 5, 7}));
  EXPECT_EQ(t.ranks_along(4, kEp), (Ranks{0, 2, 4, 6}));
  EXPECT_EQ(t.ranks_along(3, kExpertDp | kCp), (Ranks{3}));
  // dp 4, ep 2 on 4 ranks (the chapter's picture): ep {0,1} {2,3}, expert-dp {0,2} {1,3}.
  const ProcessGrid d(4, 4, 1, 1, 1, 0, /*ep=*/2);
  EXPECT_EQ(d.ranks_along(2, kEp), (Ranks{2, 3}));
  EXPECT_EQ(d.ranks_along(1, kExpertDp | kCp), (Ranks{1, 3}));
  EXPECT_EQ(d.coords(2).ep_rank, 0);
  EXPECT_EQ(d.coords(3).ep_rank, 1);
  // cp 2 x dp 4, ep 2: rank = cp_rank + 2 dp_rank; the ep group within one cp coordinate, the expert-dp
  // group with both cp ranks (each holds a part of every sequence: the experts' gradient sums over them).
  const ProcessGrid c(8, 4, 1, 1, 2, 0, /*ep=*/2);
  EXPECT_EQ(c.ranks_along(0, kEp), (Ranks{0, 2}));
  EXPECT_EQ(c.ranks_along(3, kEp), (Ranks{1, 3}));
  EXPECT_EQ(c.ranks_along(0, kExpertDp | kCp), (Ranks{0, 1, 4, 5}));
  EXPECT_EQ(c.ranks_along(3, kExpertDp | kCp), (Ranks{2, 3, 6, 7}));
  EXPECT_EQ(c.coords(3).ep_rank, 1);  // cp_rank 1, dp_rank 1
  EXPECT_EQ(c.coords(5).ep_rank, 0);  // dp_rank 2
  try {
    ProcessGrid bad(4, 4, 1, 1, 1, 0, /*ep=*/3);
    ADD_FAILURE() << "ep 3 of dp 4 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--ep 3 does not divide --dp 4"), std::string::npos) << e.what();
  }
}

// HSDP with ep: dp cut ep x (dp_shard / ep) x replicas, fastest first (torchtitan's dp_shard_in_ep,
// dp_shard_mod_ep, dp_replicate). The experts shard over the middle part (with cp), the ranks of one shard
// group holding the same experts, and replicate over the last, as every shard does.
TEST(ProcessGrid, HybridShardingWithEpShardsTheExpertsInsideEachShardGroup) {
  // dp 8, dp_shard 4, ep 2 (rank = dp_rank): shard groups {0-3} {4-7}, ep {0,1} {2,3} {4,5} {6,7}.
  const ProcessGrid g(8, 8, 1, 1, 1, /*dp_shard=*/4, /*ep=*/2);
  EXPECT_EQ(g.ranks_along(5, kEp), (Ranks{4, 5}));
  EXPECT_EQ(g.ranks_along(0, kExpertDpShard | kCp), (Ranks{0, 2}));
  EXPECT_EQ(g.ranks_along(7, kExpertDpShard | kCp), (Ranks{5, 7}));
  EXPECT_EQ(g.ranks_along(6, kDpReplicate), (Ranks{2, 6}));  // the experts' replicas: the dense shards' too
  EXPECT_EQ(g.ranks_along(1, kExpertDp | kCp), (Ranks{1, 3, 5, 7}));  // = expert shards x replicas
  EXPECT_EQ(g.ranks_along(6, kDpShard | kCp), (Ranks{4, 5, 6, 7}));
  EXPECT_EQ(g.ranks_along(3, kDp), (Ranks{0, 1, 2, 3, 4, 5, 6, 7}));
  // dp 4 x cp 2, dp_shard 2, ep 2 (rank = cp_rank + 2 dp_rank): one expert holder per shard group and cp
  // coordinate, so the experts shard over the cp ranks alone.
  const ProcessGrid c(8, 4, 1, 1, 2, /*dp_shard=*/2, /*ep=*/2);
  EXPECT_EQ(c.ranks_along(0, kEp), (Ranks{0, 2}));
  EXPECT_EQ(c.ranks_along(2, kExpertDpShard | kCp), (Ranks{2, 3}));
  EXPECT_EQ(c.ranks_along(2, kDpReplicate), (Ranks{2, 6}));
  // Without HSDP the middle part is all of expert-dp.
  const ProcessGrid plain(4, 4, 1, 1, 1, 0, /*ep=*/2);
  EXPECT_EQ(plain.ranks_along(1, kExpertDpShard | kCp), plain.ranks_along(1, kExpertDp | kCp));
  try {
    ProcessGrid bad(4, 4, 1, 1, 1, /*dp_shard=*/1, /*ep=*/2);
    ADD_FAILURE() << "ep 2 across shard groups of 1 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--ep 2 does not divide --dp-shard 1"), std::string::npos) << e.what();
  }
}

// The grad norm under ep sums over one replica's tp x pp ranks with its ep ranks: every expert once, every
// other param once (finalize_model_grads.h), and no rank of another ep group or cp coordinate.
TEST(ProcessGrid, EpModelParallelGroupIsTheReplicasTpAndPpRanksWithItsEpRanks) {
  using G = ProcessGrid;
  // tp 2 x dp 4, ep 2: rank = tp_rank + 2 dp_rank; ep groups {0,2} {4,6} (tp 0), {1,3} {5,7} (tp 1).
  const ProcessGrid t(8, 4, 1, 2, 1, 0, /*ep=*/2);
  EXPECT_EQ(t.ranks_along(0, G::kEp | G::kTp), (Ranks{0, 1, 2, 3}));
  EXPECT_EQ(t.ranks_along(5, G::kEp | G::kTp), (Ranks{4, 5, 6, 7}));
  // dp 4 x pp 2, ep 2: rank = dp_rank + 4 pp_rank; an ep group on each stage, {0,1} and {4,5}.
  const ProcessGrid p(8, 4, 2, 1, 1, 0, /*ep=*/2);
  EXPECT_EQ(p.ranks_along(0, G::kEp | G::kTp | G::kPp), (Ranks{0, 1, 4, 5}));
  EXPECT_EQ(p.ranks_along(6, G::kEp | G::kTp | G::kPp), (Ranks{2, 3, 6, 7}));
  // tp 2 x cp 2 x dp 2, ep 2: rank = tp_rank + 2 (cp_rank + 2 dp_rank); each cp coordinate its own.
  const ProcessGrid c(8, 2, 1, 2, 2, 0, /*ep=*/2);
  EXPECT_EQ(c.ranks_along(0, G::kEp | G::kTp | G::kPp), (Ranks{0, 1, 4, 5}));
  EXPECT_EQ(c.ranks_along(3, G::kEp | G::kTp | G::kPp), (Ranks{2, 3, 6, 7}));
}
