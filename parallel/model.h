// This rank's part of the model, from the grid of ranks: the layer chunks of
// its (pp, tp) coordinate (model_chunks.h), how tensor parallelism cut them
// (tensor_parallel/sharding.h, when tp > 1) and the links to the neighbouring
// pipeline stages (pipeline_parallel/pipeline_p2p.h, when pp > 1). The one
// place that knows both kinds of model parallelism; neither knows the other.
//
//   pp 1, tp 1   one chunk of every layer
//   pp 2         stage s: its range of layers (--partition), or v ranges (--virtual-stages),
//                or the two ends of a V (--schedule zb-v, dualpipev)
//   tp 2         each layer of the rank's ranges cut to its tp shard
//   cp 2         the same layers; attention runs as a ring over the cp group
//                (context_parallel/ring_attention.h) and the embedding adds the
//                true positions of the rank's zig-zag chunks
#pragma once

#include <memory>
#include <string>

#include "parallel/model_chunks.h"
#include "parallel/pipeline_parallel/pipeline_p2p.h"
#include "parallel/process_group_manager.h"
#include "parallel/tensor_parallel/sharding.h"

namespace loom::parallel {

struct ModelOptions {
  std::string partition = "uniform";  // "uniform" (by layer count) or "balanced" (by parameter count)
  int virtual_stages = 1;             // chunks per pipeline rank (interleaved 1F1B; 2 in a V)
  bool sequence_parallel = false;     // with tp > 1: Megatron-SP
  std::string recompute = "none";     // "none", "selective" or "full" (recompute.h)
  ChunkLayout layout = ChunkLayout::Interleaved;  // V: ZB-V's and DualPipeV's (partition.h)
};

struct Model {
  std::shared_ptr<ModelChunks> chunks;           // what this rank runs and trains
  std::unique_ptr<TensorParallelSharding> tp;    // how its layers were cut; null when tp = 1
  std::unique_ptr<PipelineP2P> p2p;              // links to the neighbouring stages; null when pp = 1

  // Moves the params to device in place (the tensors keep their identity, so
  // a tied wte stays one tensor); the pipeline then receives there too.
  void to(const Device& device);
};

// Collective over the pp group (the p2p channels). Errors (a grid the layers
// or heads do not divide over) before any layer is built.
Model build_model(const nn::GPTConfig& cfg, ProcessGroupManager& pgm, const ModelOptions& options = {});

// The whole GPT's state dict on global rank 0 - nn::GPT's names and order, as
// fresh CPU-side copies in the params' dtypes - gathered from every stage
// with the tp shards joined and every ep rank's experts; empty elsewhere.
// Collective over the replica's ranks (tp, ep, then pp). What a checkpoint saves and a sample is drawn from.
nn::NamedTensors gather_full_state(Model& model, ProcessGroupManager& pgm);

}  // namespace loom::parallel
