#include "parallel/model.h"

#include "parallel/context_parallel/ring_attention.h"
#include "parallel/context_parallel/zigzag.h"
#include "parallel/expert_parallel/expert_parallel.h"
#include "parallel/moe_token_shards.h"
#include "parallel/pipeline_parallel/gather_model.h"
#include "parallel/recompute.h"

namespace loom::parallel {

namespace {

// Context parallelism changes no weight, only two things inside the layers:
// every attention core becomes the ring over cp, and the positions are the
// true ones of the rank's zig-zag chunks (T / cp of every sequence): the
// embedding adds them (GPT-2's wpe), or RoPE turns q and k by them (Llama).
LayerBuilder context_parallel(LayerBuilder inner, const nn::GPTConfig& cfg, ProcessGroup& cp) {
  check_zigzag_split(cfg.block_size, cp.size());
  LayerBuilder b = inner;
  b.build = [inner, cfg, &cp](int64_t begin, int64_t end) {
    auto layers = inner.build ? inner.build(begin, end) : nn::build_gpt_layers(cfg, begin, end);
    for (int64_t i = begin; i < end; ++i) {
      nn::Layer& layer = *layers[size_t(i - begin)];
      if (i == 0) {
        static_cast<nn::EmbeddingLayer&>(layer).position_ids = zigzag_positions(cfg.block_size, cp.size(), cp.rank());
      } else if (i < cfg.num_layers() - 1) {  // a block: the full one, or its tp shard (nn::BlockLayer)
        // RoPE's positions: the rank's two chunks of c = T / 2cp tokens each
        const nn::RopeChunks starts{zigzag_chunk_starts(cfg.block_size, cp.size(), cp.rank()),
                                    cfg.block_size / (2 * cp.size())};
        auto& block = static_cast<nn::BlockLayer&>(layer);
        block.attention_core() = ring_attention_core(cp);
        block.rope_pos0() = starts;
      }
    }
    return layers;
  };
  return b;
}

}  // namespace

void Model::to(const Device& device) {
  chunks->to(device);
  if (p2p) p2p->set_device(device);
}

Model build_model(const nn::GPTConfig& cfg, ProcessGroupManager& pgm, const ModelOptions& o) {
  Model m;
  // Tensor parallelism: each layer this rank's shard (checks the split first).
  LayerBuilder layers;
  if (pgm.tp_size > 1) {
    m.tp = std::make_unique<TensorParallelSharding>(cfg, pgm.tp_group(), o.sequence_parallel);
    layers = m.tp->layer_builder();
  }
  if (pgm.cp_size > 1) layers = context_parallel(layers, cfg, pgm.cp_group());
  // Pipeline parallelism: this stage's ranges of layers; without it, all of them.
  std::vector<LayerRange> ranges{{0, cfg.num_layers()}};
  if (pgm.pp_size > 1) {
    const StagePartition parts =
        o.partition == "balanced"
            ? partition_balanced(gpt_layer_param_counts(cfg), pgm.pp_size, o.virtual_stages, o.layout)
            : partition_uniform(cfg.num_layers(), pgm.pp_size, o.virtual_stages, o.layout);
    ranges = parts[size_t(pgm.pp_rank)];
    m.p2p = std::make_unique<PipelineP2P>(pgm.pp_group(), o.layout);
  }
  // Activation recomputation: blocks, or their attention cores, rerun in backward.
  layers = with_recompute(std::move(layers), cfg, parse_recompute(o.recompute));
  m.chunks = std::make_shared<ModelChunks>(cfg, ranges, layers);
  // Experts over a micro-batch split along T: its counts summed over the ranks holding its tokens.
  use_moe_token_shards(*m.chunks, o.sequence_parallel && pgm.tp_size > 1 ? &pgm.tp_group() : nullptr,
                       pgm.cp_size > 1 ? &pgm.cp_group() : nullptr);
  return m;
}

nn::NamedTensors gather_full_state(Model& m, ProcessGroupManager& pgm) {
  // Every tp rank joins its shards into the full tensors (collective over tp);
  // tp rank 0's stages then send theirs to the first stage.
  nn::NamedTensors state = m.tp ? m.tp->full_state_dict(*m.chunks) : m.chunks->state_dict();
  if (pgm.tp_rank != 0) return {};
  // Each ep rank holds E / ep of its stage's experts: every rank's joined in first (collective over
  // ep, whose ranks share the (tp, pp) coordinate), so each stage sends all of its experts.
  if (pgm.ep_size > 1) state = gather_experts(*m.chunks, state, pgm.ep_group());
  return gather_stage_states(*m.chunks, pgm.pp_group(), &state);
}

}  // namespace loom::parallel
