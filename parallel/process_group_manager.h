// ProcessGroupManager (picotron's `pgm`): lays the world's ranks out on a grid
// world = tp × cp × dp × pp and builds one process group per axis, plus the
// groups that span axes. Megatron's order (tp-cp-ep-dp-pp, no ep here): tp
// varies fastest, then cp, then dp, then pp:
//     rank = tp_rank + tp_size * (cp_rank + cp_size * (dp_rank + dp_size * pp_rank))
// e.g. dp 2 × pp 2: dp groups {0,1} {2,3} (one stage, all replicas), pp groups
// {0,2} {1,3} (one replica, all stages). The ranks that talk most (tp, then
// cp's ring of K/V blocks, then dp's gradient all-reduces) are neighbours, on
// one node when a hostfile fills nodes in order; pipeline stages exchange only
// activations and can span nodes. (picotron orders its grid dp, pp, cp, tp.)
//
// Hybrid sharding (HSDP, FSDP2's): with dp_shard < dp the dp axis is cut in two,
//     dp_rank = dp_shard_rank + dp_shard * dp_replicate_rank;
// ZeRO-3 shards over dp_shard consecutive dp ranks (neighbours: a node's fast
// links carry the gathers) and replicates the shards over the rest, e.g. dp 4,
// dp_shard 2: shard groups {0,1} {2,3}, replicate groups {0,2} {1,3}.
//
// Expert parallelism (Megatron's expert-data-parallel layout) cuts dp the same way,
//     dp_rank = ep_rank + ep * expert_dp_rank;
// the ep group is ep consecutive dp ranks (they split the experts, E / ep each),
// the expert-dp group the dp / ep ranks holding the same experts, e.g. dp 4, ep 2:
// ep groups {0,1} {2,3}, expert-dp groups {0,2} {1,3}. Expert gradients are
// reduced over the expert-dp group (with its cp ranks, as dp_cp is for the
// rest: each cp rank's tokens give a part of the gradient), every other
// gradient over dp (x cp).
//
// A group is written once, as the axes its ranks differ along; its members are
// the rank list ProcessGrid::ranks_along gives, and the world is split by those lists.
#pragma once

#include <memory>
#include <vector>

#include "parallel/comm/distributed.h"
#include "parallel/comm/process_group.h"

namespace loom::parallel {

// The grid arithmetic alone, with no communication.
struct ProcessGrid {
  int world_size, dp_size, pp_size, tp_size, cp_size;
  int dp_shard_size;  // ZeRO-3's shard group within dp (= dp_size: no replicas)
  int ep_size;        // expert parallelism's group within dp (1: every rank holds every expert)
  // Throws "world size 4 is not dp 3 × pp 1" (and the like) for an invalid grid,
  // and for a dp_shard or an ep that does not divide dp (dp_shard 0: dp).
  ProcessGrid(int world_size, int dp, int pp, int tp = 1, int cp = 1, int dp_shard = 0, int ep = 1);

  struct Coords {
    int tp_rank, dp_rank, pp_rank, cp_rank;
    int dp_shard_rank, dp_replicate_rank;  // dp_rank = dp_shard_rank + dp_shard * dp_replicate_rank
  };
  Coords coords(int rank) const;
  enum Axes { kTp = 1, kCp = 2, kDpShard = 4, kPp = 8, kDpReplicate = 16, kDp = kDpShard | kDpReplicate };
  // The ranks that share rank's coordinates off `axes`, in rank order (= group-rank order).
  std::vector<int> ranks_along(int rank, int axes) const;
  // The first and last of rank's pp group; rank alone when pp = 1; empty on a middle stage.
  std::vector<int> embedding_group_ranks(int rank) const;
  // Of rank's dp group: the ep consecutive ranks holding it (dp_rank / ep alike), and with `axes`
  // (kTp | kPp: one replica's tp x pp ranks with its ep ranks, where the grad norm sums); of its dp x cp
  // ranks, the dp / ep · cp holding its experts (dp_rank % ep alike: its expert-dp group).
  std::vector<int> ep_group_ranks(int rank, int axes = 0) const;
  std::vector<int> expert_dp_group_ranks(int rank) const;
};

class ProcessGroupManager {
 public:
  // Collective over `world`: every rank must construct it with the same sizes.
  // An invalid grid throws on every rank before any communication.
  ProcessGroupManager(int dp, int pp, int tp = 1, int cp = 1, ProcessGroup& world = parallel::world(),
                      int dp_shard = 0, int ep = 1);

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
  int dp_shard_size() const { return grid_.dp_shard_size; }
  int dp_replicate_rank() const { return coords_.dp_replicate_rank; }
  bool hybrid_sharded() const { return grid_.dp_shard_size < grid_.dp_size; }
  int ep_size() const { return grid_.ep_size; }
  int ep_rank() const { return coords_.dp_rank % grid_.ep_size; }
  bool is_first_stage() const { return coords_.pp_rank == 0; }
  bool is_last_stage() const { return coords_.pp_rank == grid_.pp_size - 1; }

  // The groups; the axes their ranks differ along are in the constructor.
  ProcessGroup& world() { return world_; }
  ProcessGroup& tp_group() { return *tp_group_; }  // split each matmul (tensor_parallel/)
  ProcessGroup& dp_group() { return *dp_group_; }  // the replicas
  ProcessGroup& cp_group();                        // split each sequence (ring attention); error when cp = 1
  // Every replica and cp rank: gradients are averaged here (Megatron's dp group
  // "with context parallel": each cp rank saw other tokens of the same sequences).
  ProcessGroup& dp_cp_group() { return dp_cp_group_ ? *dp_cp_group_ : *dp_group_; }
  ProcessGroup& pp_group() { return *pp_group_; }  // one replica's stages, in stage order
  // HSDP: the dp x cp ranks ZeRO-3 shards over, the replicas of this rank's shard
  // (null without HSDP), and one replica's ranks, where grad norm and found_inf
  // are reduced (Megatron's intra_distributed_optimizer_instance_group; the world without HSDP).
  ProcessGroup& dp_shard_cp_group() { return dp_shard_cp_group_ ? *dp_shard_cp_group_ : dp_cp_group(); }
  ProcessGroup* dp_replicate_group() { return dp_replicate_group_.get(); }
  ProcessGroup& instance_group() { return instance_group_ ? *instance_group_ : world_; }
  // Expert parallelism: the ranks splitting the experts (the all-to-alls; error when ep = 1), and
  // those holding this rank's experts, where their gradients are reduced (the dp group when ep = 1).
  ProcessGroup& ep_group();
  ProcessGroup& expert_dp_group() { return expert_dp_group_ ? *expert_dp_group_ : *dp_group_; }
  // One model replica (pp × tp): found-inf and the grad norm are reduced here.
  ProcessGroup& model_parallel_group() { return *mp_group_; }
  // The same with its ep ranks (pp × tp × ep: together they hold every expert once; Megatron's
  // expert-tensor-model-pipeline group): the grad norm's group under ep. The ep group when pp × tp = 1.
  ProcessGroup& ep_model_parallel_group() { return ep_mp_group_ ? *ep_mp_group_ : ep_group(); }
  // The first and last stage: the tied embedding's gradients are summed here (Megatron).
  bool in_embedding_group() const { return embedding_group_ != nullptr; }
  ProcessGroup& embedding_group();  // error on a middle stage

 private:
  ProcessGroup& world_;
  ProcessGrid grid_;
  ProcessGrid::Coords coords_;
  std::unique_ptr<ProcessGroup> tp_group_, dp_group_, pp_group_, mp_group_, embedding_group_, cp_group_, dp_cp_group_;
  std::unique_ptr<ProcessGroup> dp_shard_cp_group_, dp_replicate_group_, instance_group_;  // HSDP only
  std::unique_ptr<ProcessGroup> ep_group_, expert_dp_group_;                               // ep > 1 only
  std::unique_ptr<ProcessGroup> ep_mp_group_;                                              // ep > 1, pp × tp > 1
};

}  // namespace loom::parallel
