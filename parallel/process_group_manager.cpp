#include "parallel/process_group_manager.h"

#include <algorithm>

namespace loom::parallel {

// ---- the grid arithmetic --------------------------------------------------------

ProcessGrid::ProcessGrid(int world, int dp, int pp, int tp, int cp, int dp_shard)
    : world_size(world), dp_size(dp), pp_size(pp), tp_size(tp), cp_size(cp), dp_shard_size(dp_shard ? dp_shard : dp) {
  LOOM_CHECK(dp >= 1 && pp >= 1 && tp >= 1 && cp >= 1, "ProcessGroupManager: sizes must be >= 1, got dp ", dp,
             " × pp ", pp, " × tp ", tp, " × cp ", cp);
  std::string product = str("dp ", dp, " × pp ", pp, tp == 1 ? std::string() : str(" × tp ", tp),
                            cp == 1 ? std::string() : str(" × cp ", cp));
  const int64_t n = int64_t(dp) * pp * tp * cp;
  LOOM_CHECK(n == world, "ProcessGroupManager: world size ", world, " is not ", product, " (= ", n,
             "); launch with mpirun -np ", n, " or change the sizes");
  LOOM_CHECK(dp_shard_size >= 1 && dp % dp_shard_size == 0, "ProcessGroupManager: --dp-shard ", dp_shard_size,
             " does not divide --dp ", dp, " (ZeRO-3 shards over groups of dp-shard dp ranks, replicated dp / dp-shard times)");
}

ProcessGrid::Coords ProcessGrid::coords(int rank) const {
  LOOM_CHECK(rank >= 0 && rank < world_size, "ProcessGrid: rank ", rank, " is outside a world of ", world_size);
  const int dp_rank = (rank / (tp_size * cp_size)) % dp_size;
  return {rank % tp_size, dp_rank, rank / (tp_size * cp_size * dp_size), (rank / tp_size) % cp_size,
          dp_rank % dp_shard_size, dp_rank / dp_shard_size};
}

std::vector<int> ProcessGrid::ranks_along(int rank, int axes) const {
  const Coords me = coords(rank);
  std::vector<int> ranks;
  for (int r = 0; r < world_size; ++r) {
    const Coords c = coords(r);
    if (((axes & kTp) || c.tp_rank == me.tp_rank) && ((axes & kCp) || c.cp_rank == me.cp_rank) &&
        ((axes & kDpShard) || c.dp_shard_rank == me.dp_shard_rank) &&
        ((axes & kDpReplicate) || c.dp_replicate_rank == me.dp_replicate_rank) &&
        ((axes & kPp) || c.pp_rank == me.pp_rank))
      ranks.push_back(r);
  }
  return ranks;
}

std::vector<int> ProcessGrid::embedding_group_ranks(int rank) const {
  const std::vector<int> stages = pp_group_ranks(rank);
  if (rank != stages.front() && rank != stages.back()) return {};
  if (stages.size() == 1) return stages;
  return {stages.front(), stages.back()};
}

// ---- the groups -------------------------------------------------------------------

namespace {

// The group of `members` (this rank's list; empty: no group): a split of the
// world, collective over it, in which the ranks of one list share a colour
// (the list's first rank names it) and take their places in the list as keys.
std::unique_ptr<ProcessGroup> group_of(ProcessGroup& world, const std::vector<int>& members, const char* name) {
  const auto me = std::find(members.begin(), members.end(), world.rank());
  return world.split(members.empty() ? -1 : members.front(), int(me - members.begin()), name);
}

}  // namespace

ProcessGroupManager::ProcessGroupManager(int dp, int pp, int tp_size, int cp_size, ProcessGroup& world, int dp_shard)
    : world_(world), grid_(world.size(), dp, pp, tp_size, cp_size, dp_shard), coords_(grid_.coords(world.rank())) {
  // Every rank makes the same splits in this order (each is collective over the world).
  const int r = world.rank();
  tp_group_ = group_of(world_, grid_.tp_group_ranks(r), "tp");
  dp_group_ = group_of(world_, grid_.dp_group_ranks(r), "dp");
  pp_group_ = group_of(world_, grid_.pp_group_ranks(r), "pp");
  mp_group_ = group_of(world_, grid_.model_parallel_group_ranks(r), "model_parallel");
  embedding_group_ = group_of(world_, grid_.embedding_group_ranks(r), "embedding");
  if (grid_.cp_size > 1) {  // with cp = 1 no extra communicators: dp_cp_group() is the dp group
    cp_group_ = group_of(world_, grid_.cp_group_ranks(r), "cp");
    dp_cp_group_ = group_of(world_, grid_.dp_cp_group_ranks(r), "dp_cp");
  }
  if (grid_.dp_shard_size < grid_.dp_size) {  // HSDP; without it ZeRO-3 shards over dp_cp_group()
    dp_shard_cp_group_ = group_of(world_, grid_.dp_shard_cp_group_ranks(r), "dp_shard_cp");
    dp_replicate_group_ = group_of(world_, grid_.dp_replicate_group_ranks(r), "dp_replicate");
    instance_group_ = group_of(world_, grid_.instance_group_ranks(r), "instance");
  }
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
