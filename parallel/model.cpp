#include "parallel/model.h"

#include "parallel/pipeline_parallel/gather_model.h"
#include "parallel/recompute.h"

namespace loom::parallel {

void Model::to(const Device& device) {
  chunks->to(device);
  if (p2p) p2p->set_device(device);
}

Model build_model(const nn::GPTConfig& cfg, ProcessGroupManager& pgm, const ModelOptions& o) {
  Model m;
  // Tensor parallelism: each layer this rank's shard (checks the split first).
  LayerBuilder layers;
  if (pgm.tp_size() > 1) {
    m.tp = std::make_unique<TensorParallelSharding>(cfg, pgm.tp_group(), o.sequence_parallel);
    layers = m.tp->layer_builder();
  }
  // Pipeline parallelism: this stage's ranges of layers; without it, all of them.
  std::vector<LayerRange> ranges{{0, cfg.num_layers()}};
  if (pgm.pp_size() > 1) {
    const StagePartition parts =
        o.partition == "balanced"
            ? partition_balanced(gpt_layer_param_counts(cfg), pgm.pp_size(), o.virtual_stages)
            : partition_uniform(cfg.num_layers(), pgm.pp_size(), o.virtual_stages);
    ranges = parts[size_t(pgm.pp_rank())];
    m.p2p = std::make_unique<PipelineP2P>(pgm.pp_group());
  }
  // Activation recomputation: blocks, or their attention cores, rerun in backward.
  layers = with_recompute(std::move(layers), cfg, parse_recompute(o.recompute));
  m.chunks = std::make_shared<ModelChunks>(cfg, ranges, layers);
  return m;
}

nn::NamedTensors gather_full_state(Model& m, ProcessGroupManager& pgm) {
  // Every tp rank joins its shards into the full tensors (collective over tp);
  // tp rank 0's stages then send theirs to the first stage.
  const nn::NamedTensors state = m.tp ? m.tp->full_state_dict(*m.chunks) : m.chunks->state_dict();
  if (pgm.tp_rank() != 0) return {};
  return gather_stage_states(*m.chunks, pgm.pp_group(), &state);
}

}  // namespace loom::parallel
