// TensorParallelSharding: what tensor parallelism does to a model, in one
// place. It makes each layer this rank's tp shard of it (gpt.h: cut from the
// full layers, so tp = N starts from tp = 1's weights), records where every
// shard came from (shard_map.h, for checkpoints), and answers the two
// questions the rest of training asks about the params it cut:
//   replicated_params               every tp rank holds them whole (layernorms,
//                                   row-parallel biases, wpe): counted once in
//                                   the grad norm, saved from tp rank 0
//   sequence_parallel_partial_params  under sequence parallelism each tp rank
//                                   saw T / tp of the tokens, so these
//                                   replicated params' gradients are partial
//                                   sums, added over tp after backward
//                                   (finalize_model_grads.h; Megatron's
//                                   allreduce_layernorm_grads). wpe is not one:
//                                   it is added before the scatter along T.
//
//   TensorParallelSharding tp(cfg, pgm.tp_group(), /*sequence_parallel=*/true);
//   ModelChunks model(cfg, ranges, tp.layer_builder());   // this rank's shards, named as in nn::GPT
#pragma once

#include <memory>
#include <vector>

#include "parallel/model_chunks.h"
#include "parallel/tensor_parallel/shard_map.h"

namespace loom::parallel {

class TensorParallelSharding {
 public:
  // Checks that heads, the MLP width and (under sequence parallelism)
  // block_size divide over tp: an error naming the numbers otherwise.
  TensorParallelSharding(const nn::GPTConfig& cfg, ProcessGroup& tp, bool sequence_parallel);

  // For ModelChunks: builds each range's full layers, cuts them to this rank's
  // shards and records their shard maps. Keep this object alive while it builds.
  LayerBuilder layer_builder();

  ProcessGroup& group() const { return tp_; }
  bool sequence_parallel() const { return sequence_parallel_; }
  const ShardMaps& shard_maps() const { return shard_maps_; }

  // model's params that every tp rank holds whole, by name.
  nn::NamedTensors replicated_params(const nn::Module& model) const;
  // Under sequence parallelism the replicated params whose gradients are
  // partial sums over tp (all but wpe); empty without it.
  std::vector<Tensor> sequence_parallel_partial_params(const nn::Module& model) const;
  // model.state_dict() with every shard joined into its full tensor
  // (gather_full). Collective over tp.
  nn::NamedTensors full_state_dict(nn::Module& model) const;

 private:
  nn::GPTConfig cfg_;
  ProcessGroup& tp_;
  bool sequence_parallel_;
  ShardMaps shard_maps_;
};

}  // namespace loom::parallel
