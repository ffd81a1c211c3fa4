// ProcessGroupManager (picotron's `pgm`): lays the world's ranks out on a grid
// world = tp × cp × dp × pp and builds one process group per axis, plus the
// groups that span axes.
//
// Rank layout - Megatron's order (tp-cp-ep-dp-pp, no ep here): tp varies
// fastest, then cp, then dp, then pp:
//     rank = tp_rank + tp_size * (cp_rank + cp_size * (dp_rank + dp_size * pp_rank))
// e.g. dp 2 × pp 2:         dp_rank 0   dp_rank 1
//           pp_rank 0 (first)   rank 0      rank 1
//           pp_rank 1 (last)    rank 2      rank 3
// dp groups {0,1} {2,3} (one stage, all replicas), pp groups {0,2} {1,3} (one
// replica, all stages). Why this order: the ranks that talk most (tp, then
// cp's ring of K/V blocks every layer, then dp's gradient all-reduces) are
// neighbours, i.e. on the same node when a hostfile fills nodes in order;
// pipeline stages exchange only activations and can span nodes. (picotron
// orders its grid dp, pp, cp, tp: dp slowest.)
//
// Groups:
//   tp_group              same dp, cp and pp coordinate: the ranks that split each matmul
//                         (parallel/tensor_parallel/); the innermost axis
//   cp_group              same dp, pp and tp coordinate: the ranks that split each sequence
//                         (parallel/context_parallel/: ring attention runs here)
//   dp_group              same cp, pp and tp coordinate: the replicas
//   dp_cp_group           same pp and tp coordinate, every dp and cp rank: parameter
//                         gradients are averaged here (Megatron's data-parallel group
//                         "with context parallel"): each cp rank saw other tokens of the
//                         same sequences, so a weight's gradient is the sum over cp ranks
//                         as much as over replicas. The dp group itself when cp = 1.
//   pp_group              same dp, cp and tp coordinate: activations flow here, stage order
//   model_parallel_group  all ranks of one model replica and cp rank (pp × tp): found-inf
//                         and grad-norm are reduced here (Megatron's "model parallel group")
//   embedding_group       first and last stage of one replica: the tied embedding's
//                         gradients are all-reduced here (Megatron); just the rank
//                         itself when pp == 1; not a member on middle stages
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/distributed.h"
#include "parallel/comm/process_group.h"

namespace loom::parallel {

// The grid arithmetic alone, with no communication: validated sizes, rank <->
// coordinates, and the members (global ranks, in group-rank order) of each group.
struct ProcessGrid {
  int world_size, dp_size, pp_size, tp_size, cp_size;

  // Throws "world size 4 is not dp 3 × pp 1" (and the like) for an invalid grid.
  ProcessGrid(int world_size, int dp, int pp, int tp = 1, int cp = 1);

  struct Coords {
    int tp_rank, dp_rank, pp_rank, cp_rank;
  };
  int rank_of(int dp_rank, int pp_rank, int tp_rank = 0, int cp_rank = 0) const;
  Coords coords(int rank) const;

  std::vector<int> tp_group_ranks(int rank) const;
  std::vector<int> cp_group_ranks(int rank) const;
  std::vector<int> dp_cp_group_ranks(int rank) const;
  std::vector<int> dp_group_ranks(int rank) const;
  std::vector<int> pp_group_ranks(int rank) const;
  std::vector<int> model_parallel_group_ranks(int rank) const;
  std::vector<int> embedding_group_ranks(int rank) const;  // empty on middle stages
};

class ProcessGroupManager {
 public:
  // Collective over `world`: every rank must construct it with the same sizes.
  // An invalid grid throws on every rank before any communication.
  ProcessGroupManager(int dp, int pp, int tp, int cp, ProcessGroup& world = parallel::world());
  ProcessGroupManager(int dp, int pp, int tp, ProcessGroup& world = parallel::world())
      : ProcessGroupManager(dp, pp, tp, 1, world) {}
  ProcessGroupManager(int dp, int pp, ProcessGroup& world = parallel::world()) : ProcessGroupManager(dp, pp, 1, world) {}

  const ProcessGrid& grid() const { return grid_; }
  int global_rank() const { return world_.rank(); }
  int world_size() const { return world_.size(); }

  int dp_rank() const { return coords_.dp_rank; }
  int dp_size() const { return grid_.dp_size; }
  int pp_rank() const { return coords_.pp_rank; }
  int pp_size() const { return grid_.pp_size; }
  int tp_rank() const { return coords_.tp_rank; }
  int tp_size() const { return grid_.tp_size; }
  int cp_rank() const { return coords_.cp_rank; }
  int cp_size() const { return grid_.cp_size; }

  bool is_first_stage() const { return coords_.pp_rank == 0; }
  bool is_last_stage() const { return coords_.pp_rank == grid_.pp_size - 1; }
  // Global ranks of the neighbouring stages in this replica, -1 past the ends
  // (picotron's pp_prev_rank / pp_next_rank). In pp_group they are pp_rank -/+ 1.
  int prev_pp_rank() const;
  int next_pp_rank() const;

  ProcessGroup& world() { return world_; }
  ProcessGroup& tp_group() { return *tp_group_; }
  ProcessGroup& dp_group() { return *dp_group_; }
  ProcessGroup& cp_group();  // error when cp = 1
  ProcessGroup& dp_cp_group() { return dp_cp_group_ ? *dp_cp_group_ : *dp_group_; }
  ProcessGroup& pp_group() { return *pp_group_; }
  ProcessGroup& model_parallel_group() { return *mp_group_; }
  bool in_embedding_group() const { return embedding_group_ != nullptr; }
  ProcessGroup& embedding_group();  // error on a middle stage

  // "rank 3/4: dp 1/2, pp 1/2 (last stage)" (and ", tp 1/2" when tp > 1, ", cp 1/2" when cp > 1)
  std::string describe() const;

 private:
  ProcessGroup& world_;
  ProcessGrid grid_;
  ProcessGrid::Coords coords_;
  std::unique_ptr<ProcessGroup> tp_group_, dp_group_, pp_group_, mp_group_, embedding_group_, cp_group_, dp_cp_group_;
};

}  // namespace loom::parallel
