// ProcessGroupManager (picotron's `pgm`): the world's ranks on a grid, tp fastest, then cp, dp, pp
// (Megatron's order; picotron's is dp, pp, cp, tp):
//     rank = tp_rank + tp_size * (cp_rank + cp_size * (dp_rank + dp_size * pp_rank))
// e.g. dp 2 × pp 2: dp groups {0,1} {2,3}, pp groups {0,2} {1,3}. The ranks that talk most (tp, cp's ring,
// dp's all-reduces) are neighbours, on one node when a hostfile fills nodes in order; pipeline stages pass
// only activations. dp is cut in two, the inner part consecutive dp ranks, for HSDP's shards (dp 4, dp_shard 2:
// shard groups {0,1} {2,3}, replicate groups {0,2} {1,3}) and for the experts (dp 4, ep 2: ep groups {0,1}
// {2,3} split the experts, expert-dp groups {0,2} {1,3} hold the same ones). With both, ep is cut inside each shard
// group (torchtitan's dp_shard_in_ep): dp = ep × dp_shard / ep × replicas, fastest first, the experts sharded over the
// middle part (dp_shard_mod_ep). dp 8, dp_shard 4, ep 2: ep {0,1} {2,3} {4,5} {6,7}, expert shards {0,2} {1,3} {4,6}
// {5,7}, replicas {0,4} {1,5} {2,6} {3,7}. Every group is split from one rank list: ranks_along.
#pragma once

#include "parallel/comm/distributed.h"  // parallel::world(), ProcessGroup

namespace loom::parallel {

struct ProcessGrid {  // the grid arithmetic alone, with no communication
  const int world_size, dp_size, pp_size, tp_size, cp_size, dp_shard_size, ep_size;  // the last two: dp's inner parts
  // dp_shard 0 means dp. An invalid grid throws, naming the sizes ("world size 4 is not dp 3 × pp 1").
  ProcessGrid(int world, int dp, int pp, int tp = 1, int cp = 1, int dp_shard = 0, int ep = 1)
      : world_size(world), dp_size(dp), pp_size(pp), tp_size(tp), cp_size(cp), dp_shard_size(dp_shard ? dp_shard : dp),
        ep_size(ep) {
    LOOM_CHECK(dp >= 1 && pp >= 1 && tp >= 1 && cp >= 1, "ProcessGroupManager: sizes must be >= 1, got dp ", dp,
               " × pp ", pp, " × tp ", tp, " × cp ", cp);
    const int64_t n = int64_t(dp) * pp * tp * cp;
    LOOM_CHECK(n == world, "ProcessGroupManager: world size ", world, " is not dp ", dp, " × pp ", pp,
               tp == 1 ? std::string() : str(" × tp ", tp), cp == 1 ? std::string() : str(" × cp ", cp), " (= ", n,
               "); launch with mpirun -np ", n, " or change the sizes");
    LOOM_CHECK(dp_shard_size >= 1 && dp % dp_shard_size == 0, "ProcessGroupManager: --dp-shard ", dp_shard_size,
               " does not divide --dp ", dp, " (ZeRO-3 shards over dp-shard dp ranks, dp / dp-shard replicas)");
    LOOM_CHECK(ep >= 1 && dp_shard_size % ep == 0, "ProcessGroupManager: --ep ", ep, " does not divide ",
               hybrid_sharded() ? str("--dp-shard ", dp_shard_size) : str("--dp ", dp),
               " (the ep group is ep consecutive dp ranks, inside one shard group)");
  }
  bool hybrid_sharded() const { return dp_shard_size < dp_size; }

  // A rank's coordinates (the formula above read back), and its dp_rank's inner ep and outer HSDP parts.
  struct Coords { const int global_rank, tp_rank, cp_rank, dp_rank, pp_rank, ep_rank, dp_replicate_rank; };
  Coords coords(int rank) const {
    LOOM_CHECK(rank >= 0 && rank < world_size, "ProcessGrid: rank ", rank, " is outside a world of ", world_size);
    const int dp_rank = rank / (tp_size * cp_size) % dp_size;
    return {rank, rank % tp_size, rank / tp_size % cp_size, dp_rank, rank / (tp_size * cp_size * dp_size),
            dp_rank % ep_size, dp_rank / dp_shard_size};
  }

  // One bit per axis of the grid, fastest first (dp as its three parts, above); a group runs along a set of them: a
  // shard group along dp's first two parts, expert-dp its last two, the experts' shards (HSDP) the middle one.
  enum Axes { kTp = 1, kCp = 2, kEp = 4, kExpertDpShard = 8, kDpReplicate = 16, kPp = 32,
              kDpShard = kEp | kExpertDpShard, kDp = kDpShard | kDpReplicate, kExpertDp = kDp & ~kEp };
  // The ranks that share rank's coordinates off `axes`, in rank order (= group-rank order).
  std::vector<int> ranks_along(int rank, int axes) const {
    (void)coords(rank);  // checks that rank is in the world
    const int sizes[6] = {tp_size, cp_size, ep_size, dp_shard_size / ep_size, dp_size / dp_shard_size, pp_size};
    auto first = [&](int r) {  // r's coordinates off `axes`, 0 along them: the first rank of r's group
      int f = 0;
      for (int a = 0, stride = 1; a < 6; stride *= sizes[a], r /= sizes[a], ++a)
        if (!(axes & (1 << a))) f += r % sizes[a] * stride;
      return f;
    };
    std::vector<int> ranks;
    for (int r = 0; r < world_size; ++r)
      if (first(r) == first(rank)) ranks.push_back(r);
    return ranks;
  }
  // The first and last of rank's pp group; rank alone when pp = 1; empty on a middle stage.
  std::vector<int> embedding_group_ranks(int rank) const {
    const std::vector<int> stages = ranks_along(rank, kPp);
    if (rank != stages.front() && rank != stages.back()) return {};
    return stages.size() == 1 ? stages : std::vector<int>{stages.front(), stages.back()};
  }
};

// The grid seen from this rank: picotron's attributes (pgm.tp_size, pgm.tp_rank) and Megatron's groups, each split
// along the axes at its declaration. Collective over `world`; an invalid grid throws before any communication.
class ProcessGroupManager : public ProcessGrid, public ProcessGrid::Coords {
 public:
  ProcessGroupManager(int dp, int pp, int tp = 1, int cp = 1, ProcessGroup& world = parallel::world(),
                      int dp_shard = 0, int ep = 1)
      : ProcessGrid(world.size(), dp, pp, tp, cp, dp_shard, ep), ProcessGrid::Coords(coords(world.rank())),
        world_(world) {}
  bool is_first_stage() const { return pp_rank == 0; }
  bool is_last_stage() const { return pp_rank == pp_size - 1; }
  bool in_embedding_group() const { return embedding_ != nullptr; }
  ProcessGroup& world() { return world_; }
  ProcessGroup& tp_group() { return *tp_; }
  ProcessGroup& dp_group() { return *dp_; }
  ProcessGroup& pp_group() { return *pp_; }
  ProcessGroup& model_parallel_group() { return *mp_; }
  ProcessGroup& embedding_group() { return present(embedding_, "a middle pipeline stage has no embedding group"); }
  ProcessGroup& cp_group() { return present(cp_, "no cp group with cp = 1 (context parallelism is off)"); }
  ProcessGroup& dp_cp_group() { return *dp_cp_; }
  ProcessGroup& dp_shard_cp_group() { return *dp_shard_cp_; }
  ProcessGroup* dp_replicate_group() { return dp_replicate_; }
  ProcessGroup& instance_group() { return *instance_; }
  ProcessGroup& ep_group() { return present(ep_, "no ep group with ep = 1 (expert parallelism is off)"); }
  ProcessGroup& expert_dp_group() { return *expert_dp_; }
  ProcessGroup& expert_dp_shard_cp_group() { return *expert_dp_shard_cp_; }
  ProcessGroup& ep_model_parallel_group() { return present(ep_mp_, "no ep group with ep = 1"); }

 private:
  ProcessGroup& present(ProcessGroup* g, const char* why) { LOOM_CHECK(g, "ProcessGroupManager: ", why); return *g; }
  // A split of the world: one list's ranks share a colour (its first rank), keyed by world rank (the list's order).
  ProcessGroup* group_of(const std::vector<int>& ranks, const char* name) {
    return groups_.emplace_back(world_.split(ranks.empty() ? -1 : ranks.front(), global_rank, name)).get();
  }
  ProcessGroup* along(int axes, const char* name) { return group_of(ranks_along(global_rank, axes), name); }
  ProcessGroup& world_;
  std::vector<std::unique_ptr<ProcessGroup>> groups_;  // owns the groups below, split in this order on every rank
  ProcessGroup* tp_ = along(kTp, "tp");                  // splits each matmul (tensor_parallel/)
  ProcessGroup* dp_ = along(kDp, "dp");                  // the replicas
  ProcessGroup* pp_ = along(kPp, "pp");                  // one replica's stages, in stage order
  ProcessGroup* mp_ = along(kPp | kTp, "model_parallel");  // one replica: found-inf and the grad norm reduce here
  ProcessGroup* embedding_ = group_of(embedding_group_ranks(global_rank), "embedding");  // sums tied embedding grads
  // cp's ring; dp x cp, where gradients are averaged (each cp rank saw other tokens), is dp's when cp = 1.
  ProcessGroup* cp_ = cp_size > 1 ? along(kCp, "cp") : nullptr;
  ProcessGroup* dp_cp_ = cp_size > 1 ? along(kDp | kCp, "dp_cp") : dp_;
  // HSDP: ZeRO-3 shards over dp_shard x cp, the shards' replicas (null without HSDP), and one replica's
  // ranks, where grad norm and found_inf are reduced (Megatron's intra-instance group; else the world).
  ProcessGroup* dp_shard_cp_ = hybrid_sharded() ? along(kDpShard | kCp, "dp_shard_cp") : dp_cp_;
  ProcessGroup* dp_replicate_ = hybrid_sharded() ? along(kDpReplicate, "dp_replicate") : nullptr;
  ProcessGroup* instance_ = hybrid_sharded() ? along(kTp | kCp | kDpShard | kPp, "instance") : &world_;
  // Experts: the ranks splitting them (the all-to-alls); those holding this rank's, with their cp ranks, where
  // their gradients are summed (dp when ep = 1), and under HSDP those of them inside the shard group, where ZeRO-3
  // shards them; one replica's tp x pp ranks with its ep ranks, every expert once: the grad norm's group
  // (Megatron's expert-tensor-model-pipeline group; the ep group when pp x tp = 1).
  ProcessGroup* ep_ = ep_size > 1 ? along(kEp, "ep") : nullptr;
  ProcessGroup* expert_dp_ = ep_size > 1 ? along(kExpertDp | kCp, "expert_dp") : dp_;
  ProcessGroup* expert_dp_shard_cp_ =
      ep_size > 1 && hybrid_sharded() ? along(kExpertDpShard | kCp, "expert_dp_shard_cp") : expert_dp_;
  ProcessGroup* ep_mp_ = ep_size > 1 && pp_size * tp_size > 1 ? along(kEp | kTp | kPp, "ep_model_parallel") : ep_;
};

}  // namespace loom::parallel
