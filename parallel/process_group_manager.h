// ProcessGroupManager (picotron's `pgm`): the world's ranks on a grid, tp
// fastest, then cp, dp, pp (Megatron's order; picotron's is dp, pp, cp, tp):
//     rank = tp_rank + tp_size * (cp_rank + cp_size * (dp_rank + dp_size * pp_rank))
// e.g. dp 2 × pp 2: dp groups {0,1} {2,3}, pp groups {0,2} {1,3}. The ranks that
// talk most (tp, cp's ring, dp's all-reduces) are neighbours, on one node when a
// hostfile fills nodes in order; pipeline stages pass only activations.
// dp is cut in two, the inner part consecutive dp ranks, for HSDP's shards (dp 4,
// dp_shard 2: shard groups {0,1} {2,3}, replicate groups {0,2} {1,3}) and for the
// experts (dp 4, ep 2: ep groups {0,1} {2,3} split the experts, expert-dp groups
// {0,2} {1,3} hold the same ones). With both, ep is cut inside each shard group (torchtitan's
// dp_shard_in_ep; --ep divides --dp-shard) and dp is ep x (dp_shard / ep) x replicas, fastest first:
// the experts are sharded over the shard group's ranks holding the same ones (torchtitan's
// dp_shard_mod_ep) and replicated as every shard is. dp 4, dp_shard 2, ep 2: ep {0,1} {2,3}, expert
// shards {0} {1} {2} {3}, replicas {0,2} {1,3}; dp 8, dp_shard 4, ep 2: ep {0,1} {2,3} {4,5} {6,7},
// expert shards {0,2} {1,3} {4,6} {5,7}, replicas {0,4} {1,5} {2,6} {3,7}, expert-dp {0,2,4,6} {1,3,5,7}.
// Every group is one rank list, ranks_along: the ranks that share this rank's coordinates off the
// group's axes; the world is split by them.
#pragma once

#include <memory>
#include <vector>

#include "parallel/comm/distributed.h"
#include "parallel/comm/process_group.h"

namespace loom::parallel {

// The grid arithmetic alone, with no communication.
struct ProcessGrid {
  int world_size, dp_size, pp_size, tp_size, cp_size;
  int dp_shard_size;  // HSDP's inner part of dp (= dp_size: no replicas)
  int ep_size;        // the experts' inner part of dp (1: every rank holds every expert)
  // Throws for an invalid grid ("world size 4 is not dp 3 × pp 1"; dp_shard 0: dp).
  ProcessGrid(int world_size, int dp, int pp, int tp = 1, int cp = 1, int dp_shard = 0, int ep = 1);

  struct Coords { int tp_rank, cp_rank, dp_rank, pp_rank; };
  Coords coords(int rank) const;
  // The axes of the grid reshaped tp × cp × (ep × dp_shard / ep × dp / dp_shard = dp) × pp: a shard group
  // is the first two dp parts, expert-dp the last two, the experts' shards (HSDP) the middle one.
  enum Axes {
    kTp = 1, kCp = 2, kDpShard = 4, kDpReplicate = 8, kDp = 12, kPp = 16, kEp = 32, kExpertDp = 64, kExpertDpShard = 128
  };
  // The ranks that share rank's coordinates off `axes`, in rank order (= group-rank order).
  std::vector<int> ranks_along(int rank, int axes) const;
  // The first and last of rank's pp group; rank alone when pp = 1; empty on a middle stage.
  std::vector<int> embedding_group_ranks(int rank) const;
};

class ProcessGroupManager {
 public:
  // Collective over `world` (the same sizes on every rank); an invalid grid throws before any communication.
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
  int dp_replicate_rank() const { return coords_.dp_rank / grid_.dp_shard_size; }
  bool hybrid_sharded() const { return grid_.dp_shard_size < grid_.dp_size; }
  int ep_size() const { return grid_.ep_size; }
  int ep_rank() const { return coords_.dp_rank % grid_.ep_size; }
  bool is_first_stage() const { return coords_.pp_rank == 0; }
  bool is_last_stage() const { return coords_.pp_rank == grid_.pp_size - 1; }

  // The groups (the axes each spans are in the constructor).
  ProcessGroup& world() { return world_; }
  ProcessGroup& tp_group() { return *tp_group_; }  // split each matmul (tensor_parallel/)
  ProcessGroup& dp_group() { return *dp_group_; }  // the replicas
  ProcessGroup& pp_group() { return *pp_group_; }  // one replica's stages, in stage order
  ProcessGroup& cp_group() { return present(cp_group_, "no cp group with cp = 1 (context parallelism is off)"); }
  // Gradients are averaged over dp x cp (each cp rank saw other tokens of the same sequences).
  ProcessGroup& dp_cp_group() { return dp_cp_group_ ? *dp_cp_group_ : *dp_group_; }
  // HSDP: ZeRO-3 shards over dp_shard x cp, the shards' replicas (null without HSDP), and one replica's
  // ranks, where grad norm and found_inf are reduced (Megatron's intra-instance group; else the world).
  ProcessGroup& dp_shard_cp_group() { return dp_shard_cp_group_ ? *dp_shard_cp_group_ : dp_cp_group(); }
  ProcessGroup* dp_replicate_group() { return dp_replicate_group_.get(); }
  ProcessGroup& instance_group() { return instance_group_ ? *instance_group_ : world_; }
  // Experts: the ranks splitting them (the all-to-alls), and those holding this rank's with their
  // cp ranks, where their gradients are reduced (the dp group when ep = 1).
  ProcessGroup& ep_group() { return present(ep_group_, "no ep group with ep = 1 (expert parallelism is off)"); }
  ProcessGroup& expert_dp_group() { return expert_dp_group_ ? *expert_dp_group_ : *dp_group_; }
  // HSDP: the experts' shard group, expert-dp's ranks inside this rank's shard group (expert-dp without HSDP).
  ProcessGroup& expert_dp_shard_cp_group() {
    return expert_dp_shard_cp_group_ ? *expert_dp_shard_cp_group_ : expert_dp_group();
  }
  // One model replica (pp × tp): found-inf and the grad norm are reduced here.
  ProcessGroup& model_parallel_group() { return *mp_group_; }
  // The same with its ep ranks (pp × tp × ep: together they hold every expert once; Megatron's
  // expert-tensor-model-pipeline group): the grad norm's group under ep. The ep group when pp × tp = 1.
  ProcessGroup& ep_model_parallel_group() { return ep_mp_group_ ? *ep_mp_group_ : ep_group(); }
  // The first and last stage: the tied embedding's gradients are summed here (Megatron).
  bool in_embedding_group() const { return embedding_group_ != nullptr; }
  ProcessGroup& embedding_group() {
    return present(embedding_group_, "a middle pipeline stage: only the first and last stage are in the embedding group");
  }

 private:
  static ProcessGroup& present(const std::unique_ptr<ProcessGroup>& g, const char* why) {
    LOOM_CHECK(g, "ProcessGroupManager: ", why);
    return *g;
  }
  ProcessGroup& world_;
  ProcessGrid grid_;
  ProcessGrid::Coords coords_;
  std::unique_ptr<ProcessGroup> tp_group_, dp_group_, pp_group_, mp_group_, embedding_group_, cp_group_, dp_cp_group_;
  std::unique_ptr<ProcessGroup> dp_shard_cp_group_, dp_replicate_group_, instance_group_;  // HSDP only
  std::unique_ptr<ProcessGroup> ep_group_, expert_dp_group_;                               // ep > 1 only
  std::unique_ptr<ProcessGroup> expert_dp_shard_cp_group_;                                 // ep > 1 with HSDP
  std::unique_ptr<ProcessGroup> ep_mp_group_;                                              // ep > 1, pp × tp > 1
};

}  // namespace loom::parallel
