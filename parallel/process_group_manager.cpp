#include "parallel/process_group_manager.h"

namespace loom::parallel {

// ---- the grid arithmetic --------------------------------------------------------

ProcessGrid::ProcessGrid(int world, int dp, int pp, int tp) : world_size(world), dp_size(dp), pp_size(pp), tp_size(tp) {
  LOOM_CHECK(dp >= 1 && pp >= 1 && tp >= 1, "ProcessGroupManager: sizes must be >= 1, got dp ", dp, " × pp ", pp,
             " × tp ", tp);
  std::string product = tp == 1 ? str("dp ", dp, " × pp ", pp) : str("dp ", dp, " × pp ", pp, " × tp ", tp);
  LOOM_CHECK(int64_t(dp) * pp * tp == world, "ProcessGroupManager: world size ", world, " is not ", product,
             " (= ", int64_t(dp) * pp * tp, "); launch with mpirun -np ", int64_t(dp) * pp * tp,
             " or change the sizes");
}

int ProcessGrid::rank_of(int dp_rank, int pp_rank, int tp_rank) const {
  return tp_rank + tp_size * (dp_rank + dp_size * pp_rank);
}

ProcessGrid::Coords ProcessGrid::coords(int rank) const {
  LOOM_CHECK(rank >= 0 && rank < world_size, "ProcessGrid: rank ", rank, " is outside a world of ", world_size);
  return {rank % tp_size, (rank / tp_size) % dp_size, rank / (tp_size * dp_size)};
}

std::vector<int> ProcessGrid::tp_group_ranks(int rank) const {
  Coords c = coords(rank);
  std::vector<int> ranks;
  for (int t = 0; t < tp_size; ++t) ranks.push_back(rank_of(c.dp_rank, c.pp_rank, t));
  return ranks;
}

std::vector<int> ProcessGrid::dp_group_ranks(int rank) const {
  Coords c = coords(rank);
  std::vector<int> ranks;
  for (int d = 0; d < dp_size; ++d) ranks.push_back(rank_of(d, c.pp_rank, c.tp_rank));
  return ranks;
}

std::vector<int> ProcessGrid::pp_group_ranks(int rank) const {
  Coords c = coords(rank);
  std::vector<int> ranks;
  for (int p = 0; p < pp_size; ++p) ranks.push_back(rank_of(c.dp_rank, p, c.tp_rank));
  return ranks;
}

std::vector<int> ProcessGrid::model_parallel_group_ranks(int rank) const {
  Coords c = coords(rank);
  std::vector<int> ranks;
  for (int p = 0; p < pp_size; ++p)
    for (int t = 0; t < tp_size; ++t) ranks.push_back(rank_of(c.dp_rank, p, t));
  return ranks;
}

std::vector<int> ProcessGrid::embedding_group_ranks(int rank) const {
  Coords c = coords(rank);
  if (c.pp_rank != 0 && c.pp_rank != pp_size - 1) return {};
  if (pp_size == 1) return {rank};
  return {rank_of(c.dp_rank, 0, c.tp_rank), rank_of(c.dp_rank, pp_size - 1, c.tp_rank)};
}

// ---- the groups -------------------------------------------------------------------

ProcessGroupManager::ProcessGroupManager(int dp, int pp, int tp_size, ProcessGroup& world)
    : world_(world), grid_(world.size(), dp, pp, tp_size), coords_(grid_.coords(world.rank())) {
  // Each split is a collective over the world: every rank makes all five calls,
  // in this order. The color names the group a rank joins (ranks with equal
  // coordinates off the axis), the key orders the ranks inside it.
  const int tp = grid_.tp_size, t = coords_.tp_rank, d = coords_.dp_rank, p = coords_.pp_rank;
  tp_group_ = world_.split(/*color=*/d + grid_.dp_size * p, /*key=*/t, "tp");
  dp_group_ = world_.split(t + tp * p, d, "dp");
  pp_group_ = world_.split(t + tp * d, p, "pp");
  mp_group_ = world_.split(d, t + tp * p, "model_parallel");
  bool embedding = is_first_stage() || is_last_stage();
  embedding_group_ = world_.split(embedding ? t + tp * d : -1, p, "embedding");
}

int ProcessGroupManager::prev_pp_rank() const {
  return is_first_stage() ? -1 : grid_.rank_of(coords_.dp_rank, coords_.pp_rank - 1, coords_.tp_rank);
}

int ProcessGroupManager::next_pp_rank() const {
  return is_last_stage() ? -1 : grid_.rank_of(coords_.dp_rank, coords_.pp_rank + 1, coords_.tp_rank);
}

ProcessGroup& ProcessGroupManager::embedding_group() {
  LOOM_CHECK(embedding_group_, "ProcessGroupManager: rank ", global_rank(), " is pipeline stage ", pp_rank(), " of ",
             pp_size(), "; only the first and last stage are in the embedding group");
  return *embedding_group_;
}

std::string ProcessGroupManager::describe() const {
  std::string stage = pp_size() == 1 ? "" : is_first_stage() ? " (first stage)" : is_last_stage() ? " (last stage)" : "";
  return str("rank ", global_rank(), "/", world_size(), ": dp ", dp_rank(), "/", dp_size(), ", pp ", pp_rank(), "/",
             pp_size(), stage, tp_size() == 1 ? std::string() : str(", tp ", tp_rank(), "/", tp_size()));
}

}  // namespace loom::parallel
