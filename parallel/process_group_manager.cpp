#include "parallel/process_group_manager.h"

namespace loom::parallel {

// ---- the grid arithmetic --------------------------------------------------------

ProcessGrid::ProcessGrid(int world, int dp, int pp, int tp, int cp)
    : world_size(world), dp_size(dp), pp_size(pp), tp_size(tp), cp_size(cp) {
  LOOM_CHECK(dp >= 1 && pp >= 1 && tp >= 1 && cp >= 1, "ProcessGroupManager: sizes must be >= 1, got dp ", dp,
             " × pp ", pp, " × tp ", tp, " × cp ", cp);
  std::string product = str("dp ", dp, " × pp ", pp, tp == 1 ? std::string() : str(" × tp ", tp),
                            cp == 1 ? std::string() : str(" × cp ", cp));
  const int64_t n = int64_t(dp) * pp * tp * cp;
  LOOM_CHECK(n == world, "ProcessGroupManager: world size ", world, " is not ", product, " (= ", n,
             "); launch with mpirun -np ", n, " or change the sizes");
}

int ProcessGrid::rank_of(int dp_rank, int pp_rank, int tp_rank, int cp_rank) const {
  return tp_rank + tp_size * (cp_rank + cp_size * (dp_rank + dp_size * pp_rank));
}

ProcessGrid::Coords ProcessGrid::coords(int rank) const {
  LOOM_CHECK(rank >= 0 && rank < world_size, "ProcessGrid: rank ", rank, " is outside a world of ", world_size);
  return {rank % tp_size, (rank / (tp_size * cp_size)) % dp_size, rank / (tp_size * cp_size * dp_size),
          (rank / tp_size) % cp_size};
}

std::vector<int> ProcessGrid::tp_group_ranks(int rank) const {
  Coords c = coords(rank);
  std::vector<int> ranks;
  for (int t = 0; t < tp_size; ++t) ranks.push_back(rank_of(c.dp_rank, c.pp_rank, t, c.cp_rank));
  return ranks;
}

std::vector<int> ProcessGrid::dp_group_ranks(int rank) const {
  Coords c = coords(rank);
  std::vector<int> ranks;
  for (int d = 0; d < dp_size; ++d) ranks.push_back(rank_of(d, c.pp_rank, c.tp_rank, c.cp_rank));
  return ranks;
}

std::vector<int> ProcessGrid::pp_group_ranks(int rank) const {
  Coords c = coords(rank);
  std::vector<int> ranks;
  for (int p = 0; p < pp_size; ++p) ranks.push_back(rank_of(c.dp_rank, p, c.tp_rank, c.cp_rank));
  return ranks;
}

std::vector<int> ProcessGrid::model_parallel_group_ranks(int rank) const {
  Coords c = coords(rank);
  std::vector<int> ranks;
  for (int p = 0; p < pp_size; ++p)
    for (int t = 0; t < tp_size; ++t) ranks.push_back(rank_of(c.dp_rank, p, t, c.cp_rank));
  return ranks;
}

std::vector<int> ProcessGrid::embedding_group_ranks(int rank) const {
  Coords c = coords(rank);
  if (c.pp_rank != 0 && c.pp_rank != pp_size - 1) return {};
  if (pp_size == 1) return {rank};
  return {rank_of(c.dp_rank, 0, c.tp_rank, c.cp_rank), rank_of(c.dp_rank, pp_size - 1, c.tp_rank, c.cp_rank)};
}

std::vector<int> ProcessGrid::cp_group_ranks(int rank) const {
  Coords c = coords(rank);
  std::vector<int> ranks;
  for (int k = 0; k < cp_size; ++k) ranks.push_back(rank_of(c.dp_rank, c.pp_rank, c.tp_rank, k));
  return ranks;
}

std::vector<int> ProcessGrid::dp_cp_group_ranks(int rank) const {
  Coords c = coords(rank);
  std::vector<int> ranks;
  for (int d = 0; d < dp_size; ++d)
    for (int k = 0; k < cp_size; ++k) ranks.push_back(rank_of(d, c.pp_rank, c.tp_rank, k));
  return ranks;
}

// ---- the groups -------------------------------------------------------------------

ProcessGroupManager::ProcessGroupManager(int dp, int pp, int tp_size, int cp_size, ProcessGroup& world)
    : world_(world), grid_(world.size(), dp, pp, tp_size, cp_size), coords_(grid_.coords(world.rank())) {
  // Each split is a collective over the world: every rank makes the same calls,
  // in this order. The color names the group a rank joins (ranks with equal
  // coordinates off the axis), the key orders the ranks inside it.
  const int tp = grid_.tp_size, cp = grid_.cp_size, t = coords_.tp_rank, d = coords_.dp_rank, p = coords_.pp_rank;
  const int c = coords_.cp_rank;
  tp_group_ = world_.split(/*color=*/c + cp * (d + grid_.dp_size * p), /*key=*/t, "tp");
  dp_group_ = world_.split(t + tp * (c + cp * p), d, "dp");
  pp_group_ = world_.split(t + tp * (c + cp * d), p, "pp");
  mp_group_ = world_.split(c + cp * d, t + tp * p, "model_parallel");
  bool embedding = is_first_stage() || is_last_stage();
  embedding_group_ = world_.split(embedding ? t + tp * (c + cp * d) : -1, p, "embedding");
  if (cp > 1) {  // with cp = 1 no extra communicators: dp_cp_group() is the dp group
    cp_group_ = world_.split(t + tp * (d + grid_.dp_size * p), c, "cp");
    dp_cp_group_ = world_.split(t + tp * p, c + cp * d, "dp_cp");
  }
}

int ProcessGroupManager::prev_pp_rank() const {
  return is_first_stage() ? -1 : grid_.rank_of(coords_.dp_rank, coords_.pp_rank - 1, coords_.tp_rank, coords_.cp_rank);
}

int ProcessGroupManager::next_pp_rank() const {
  return is_last_stage() ? -1 : grid_.rank_of(coords_.dp_rank, coords_.pp_rank + 1, coords_.tp_rank, coords_.cp_rank);
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

std::string ProcessGroupManager::describe() const {
  std::string stage = pp_size() == 1 ? "" : is_first_stage() ? " (first stage)" : is_last_stage() ? " (last stage)" : "";
  return str("rank ", global_rank(), "/", world_size(), ": dp ", dp_rank(), "/", dp_size(), ", pp ", pp_rank(), "/",
             pp_size(), stage, tp_size() == 1 ? std::string() : str(", tp ", tp_rank(), "/", tp_size()),
             cp_size() == 1 ? std::string() : str(", cp ", cp_rank(), "/", cp_size()));
}

}  // namespace loom::parallel
