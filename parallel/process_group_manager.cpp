#include "parallel/process_group_manager.h"

#include <algorithm>
#include <array>

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
  LOOM_CHECK(dp_shard_size % ep == 0, "ProcessGroupManager: --ep ", ep, " does not divide --dp-shard ", dp_shard_size,
             " (the ep group is ep consecutive ranks of one shard group)");
}

ProcessGrid::Coords ProcessGrid::coords(int rank) const {
  LOOM_CHECK(rank >= 0 && rank < world_size, "ProcessGrid: rank ", rank, " is outside a world of ", world_size);
  return {rank % tp_size, (rank / tp_size) % cp_size, (rank / (tp_size * cp_size)) % dp_size,
          rank / (tp_size * cp_size * dp_size)};
}

std::vector<int> ProcessGrid::ranks_along(int rank, int axes) const {
  (void)coords(rank);  // checks that rank is in the world
  const std::array<int, 6> sizes = {tp_size, cp_size, ep_size, dp_shard_size / ep_size, dp_size / dp_shard_size,
                                    pp_size};  // fastest first; dp in three parts (ep 1: no first, no HSDP: no last)
  const std::array<int, 6> axis = {kTp, kCp, kDpShard | kEp, kDpShard | kExpertDp | kExpertDpShard,
                                   kDpReplicate | kExpertDp, kPp};
  auto fixed = [&](int r) {  // r's coordinates off `axes` (0 along them)
    std::array<int, 6> c{};
    for (size_t a = 0; a < sizes.size(); r /= sizes[a], ++a)
      if (!(axes & axis[a])) c[a] = r % sizes[a];
    return c;
  };
  std::vector<int> ranks;
  for (int r = 0; r < world_size; ++r)
    if (fixed(r) == fixed(rank)) ranks.push_back(r);
  return ranks;
}

std::vector<int> ProcessGrid::embedding_group_ranks(int rank) const {
  const std::vector<int> stages = ranks_along(rank, kPp);
  if (rank != stages.front() && rank != stages.back()) return {};
  return stages.size() == 1 ? stages : std::vector<int>{stages.front(), stages.back()};
}

ProcessGroupManager::ProcessGroupManager(int dp, int pp, int tp, int cp, ProcessGroup& world, int dp_shard, int ep)
    : world_(world), grid_(world.size(), dp, pp, tp, cp, dp_shard, ep), coords_(grid_.coords(world.rank())) {
  // A split of the world: one list's ranks share a colour (its first rank), their places are the keys.
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
  if (cp > 1) {  // with cp = 1 no extra communicators: dp_cp_group() is the dp group
    cp_group_ = along(G::kCp, "cp");
    dp_cp_group_ = along(G::kDp | G::kCp, "dp_cp");
  }
  if (hybrid_sharded()) {  // without HSDP ZeRO-3 shards over dp_cp_group()
    dp_shard_cp_group_ = along(G::kDpShard | G::kCp, "dp_shard_cp");
    dp_replicate_group_ = along(G::kDpReplicate, "dp_replicate");
    instance_group_ = along(G::kTp | G::kCp | G::kDpShard | G::kPp, "instance");
  }
  if (ep > 1) {  // the experts' gradients are summed over their holders' cp ranks too, as dp_cp's are
    ep_group_ = along(G::kEp, "ep");
    expert_dp_group_ = along(G::kExpertDp | G::kCp, "expert_dp");
    if (hybrid_sharded())  // ZeRO-3 shards the experts inside the shard group, replicated over dp_replicate
      expert_dp_shard_cp_group_ = along(G::kExpertDpShard | G::kCp, "expert_dp_shard_cp");
    if (pp * tp > 1)  // one replica's tp x pp ranks with its ep ranks: the grad norm of held experts sums here
      ep_mp_group_ = along(G::kEp | G::kTp | G::kPp, "ep_model_parallel");
  }
}

}  // namespace loom::parallel
