#include "parallel/process_group_manager.h"

#include <algorithm>

namespace loom::parallel {

ProcessGrid::ProcessGrid(int world, int dp, int pp, int tp, int cp, int dp_shard, int ep)
    : world_size(world), dp_size(dp), pp_size(pp), tp_size(tp), cp_size(cp), dp_shard_size(dp_shard ? dp_shard : dp),
      ep_size(ep) {
  LOOM_CHECK(dp >= 1 && pp >= 1 && tp >= 1 && cp >= 1, "ProcessGroupManager: sizes must be >= 1, got dp ", dp,
             " × pp ", pp, " × tp ", tp, " × cp ", cp);
  const int64_t n = int64_t(dp) * pp * tp * cp;
  LOOM_CHECK(n == world, "ProcessGroupManager: world size ", world, " is not dp ", dp, " × pp ", pp,
             tp == 1 ? std::string() : str(" × tp ", tp), cp == 1 ? std::string() : str(" × cp ", cp), " (= ", n,
             "); launch with mpirun -np ", n, " or change the sizes");
  LOOM_CHECK(dp_shard_size >= 1 && dp % dp_shard_size == 0, "ProcessGroupManager: --dp-shard ", dp_shard_size,
             " does not divide --dp ", dp, " (ZeRO-3 shards over groups of dp-shard dp ranks, replicated dp / dp-shard times)");
  LOOM_CHECK(ep >= 1 && dp % ep == 0, "ProcessGroupManager: --ep ", ep, " does not divide --dp ", dp,
             " (the ep group is ep consecutive dp ranks)");
}

ProcessGrid::Coords ProcessGrid::coords(int rank) const {
  LOOM_CHECK(rank >= 0 && rank < world_size, "ProcessGrid: rank ", rank, " is outside a world of ", world_size);
  const int dp_rank = (rank / (tp_size * cp_size)) % dp_size;
  return {rank % tp_size, dp_rank, rank / (tp_size * cp_size * dp_size), (rank / tp_size) % cp_size,
          dp_rank % dp_shard_size, dp_rank / dp_shard_size};
}

std::vector<int> ProcessGrid::ranks_along(int rank, int axes) const {
  const Coords me = coords(rank);
  auto same = [&](int axis, int a, int b) { return (axes & axis) || a == b; };
  std::vector<int> ranks;
  for (int r = 0; r < world_size; ++r) {
    const Coords c = coords(r);
    if (same(kTp, c.tp_rank, me.tp_rank) && same(kCp, c.cp_rank, me.cp_rank) && same(kPp, c.pp_rank, me.pp_rank) &&
        same(kDpShard, c.dp_shard_rank, me.dp_shard_rank) && same(kDpReplicate, c.dp_replicate_rank, me.dp_replicate_rank))
      ranks.push_back(r);
  }
  return ranks;
}

std::vector<int> ProcessGrid::embedding_group_ranks(int rank) const {
  const std::vector<int> stages = ranks_along(rank, kPp);
  if (rank != stages.front() && rank != stages.back()) return {};
  return stages.size() == 1 ? stages : std::vector<int>{stages.front(), stages.back()};
}

std::vector<int> ProcessGrid::ep_group_ranks(int rank, int axes) const {
  std::vector<int> ranks;
  for (int r : ranks_along(rank, kDp | axes))
    if (coords(r).dp_rank / ep_size == coords(rank).dp_rank / ep_size) ranks.push_back(r);
  return ranks;
}

std::vector<int> ProcessGrid::expert_dp_group_ranks(int rank) const {
  std::vector<int> ranks;  // with its cp ranks: each holds a part of every sequence, as dp_cp averages the rest
  for (int r : ranks_along(rank, kDp | kCp))
    if (coords(r).dp_rank % ep_size == coords(rank).dp_rank % ep_size) ranks.push_back(r);
  return ranks;
}

ProcessGroupManager::ProcessGroupManager(int dp, int pp, int tp_size, int cp_size, ProcessGroup& world, int dp_shard,
                                         int ep)
    : world_(world), grid_(world.size(), dp, pp, tp_size, cp_size, dp_shard, ep), coords_(grid_.coords(world.rank())) {
  // The group of this rank's `members` (empty: none): a split of the world in which the ranks
  // of one list share a colour (the list's first rank) and take their places in it as keys.
  auto group_of = [&](const std::vector<int>& members, const char* name) {
    const auto me = std::find(members.begin(), members.end(), world.rank());
    return world.split(members.empty() ? -1 : members.front(), int(me - members.begin()), name);
  };
  auto along = [&](int axes, const char* name) { return group_of(grid_.ranks_along(world.rank(), axes), name); };
  using G = ProcessGrid;  // every rank makes the same splits in this order (each is collective over the world)
  tp_group_ = along(G::kTp, "tp");
  dp_group_ = along(G::kDp, "dp");
  pp_group_ = along(G::kPp, "pp");
  mp_group_ = along(G::kPp | G::kTp, "model_parallel");
  embedding_group_ = group_of(grid_.embedding_group_ranks(world.rank()), "embedding");
  if (cp_size > 1) {  // with cp = 1 no extra communicators: dp_cp_group() is the dp group
    cp_group_ = along(G::kCp, "cp");
    dp_cp_group_ = along(G::kDp | G::kCp, "dp_cp");
  }
  if (hybrid_sharded()) {  // without HSDP ZeRO-3 shards over dp_cp_group()
    dp_shard_cp_group_ = along(G::kDpShard | G::kCp, "dp_shard_cp");
    dp_replicate_group_ = along(G::kDpReplicate, "dp_replicate");
    instance_group_ = along(G::kTp | G::kCp | G::kDpShard | G::kPp, "instance");
  }
  if (ep > 1) {  // expert parallelism: dp cut in two (the header's layout)
    ep_group_ = group_of(grid_.ep_group_ranks(world.rank()), "ep");
    expert_dp_group_ = group_of(grid_.expert_dp_group_ranks(world.rank()), "expert_dp");
    if (pp * tp_size > 1)
      ep_mp_group_ = group_of(grid_.ep_group_ranks(world.rank(), G::kTp | G::kPp), "ep_model_parallel");
  }
}

ProcessGroup& ProcessGroupManager::ep_group() {
  LOOM_CHECK(ep_group_, "ProcessGroupManager: no ep group with ep = 1 (expert parallelism is off)");
  return *ep_group_;
}

ProcessGroup& ProcessGroupManager::cp_group() {
  LOOM_CHECK(cp_group_, "ProcessGroupManager: no cp group with cp = 1 (context parallelism is off)");
  return *cp_group_;
}

ProcessGroup& ProcessGroupManager::embedding_group() {
  LOOM_CHECK(embedding_group_, "ProcessGroupManager: rank ", global_rank(), " is pipeline stage ", pp_rank(), " of ",
             pp_size(), "; only the first and last stage are in the embedding group");
  return *embedding_group_;
}

}  // namespace loom::parallel
