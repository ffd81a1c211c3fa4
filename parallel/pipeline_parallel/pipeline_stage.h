// PipelineStage: the layers of the GPT that this pipeline rank owns, as one
// Module (picotron's PipelineParallel wrapping its slice of decoder layers;
// Megatron's model chunk). Only those layers are ever built, so a rank's
// parameter memory is its stage's, not the model's.
//
// Per micro-batch a stage runs
//   forward(input):  first stage: input = token ids [B, T] int64 -> [B, T, C]
//                    middle stage: input = the activation received from the
//                      previous stage [B, T, C] -> [B, T, C]
//                    last stage: ... -> logits [B, T, V]
//   backward(input, output, output_grad): back-propagates the gradient
//                    received from the next stage (or the loss on the last
//                    stage) and returns d loss / d input, to send upstream.
//
// Parameter names are the full model's (nn/gpt.h): a stage holding layers
// [3, 5) of a 4-block GPT has blocks.2.* and blocks.3.*, the last stage has
// ..., ln_f.weight, ln_f.bias and wte.weight - the LM head's own copy of the
// token embedding, under the embedding's name because it *is* that weight
// (kept equal to the first stage's by the shared-weight handler,
// shared_weights.h). Checkpoints and optimizer groups therefore treat a stage
// like a slice of the full model; a consumer merging stages keeps one wte.
//
// With tensor parallelism (tp > 1) every layer of the stage is split over the
// tp group (tensor_parallel/gpt.h): this rank holds its shards, under the same
// names, and the last stage's loss is the vocab-parallel cross-entropy. With
// pp = 1 a tp run is one stage holding every layer.
//
// With virtual stages (interleaved 1F1B, partition.h) a rank holds v model
// chunks, each a range of layers: forward(input, chunk) runs chunk c's layers.
// All chunks' parameters live in this one Module, still under the full
// model's names and in the model's layer order (rank 0 of pp 2 x v 2 over 8
// layers: wte, wpe, blocks.0, blocks.3, blocks.4), so the data-parallel
// wrapper, the optimizer and the checkpoint see one list, as before.
#pragma once

#include <memory>
#include <vector>

#include "nn/gpt.h"
#include "parallel/pipeline_parallel/partition.h"
#include "parallel/tensor_parallel/shard_map.h"

namespace loom::parallel {

// The tp group the stage's layers are split over (null or size 1: none), and
// whether they run sequence-parallel (Megatron-SP).
struct StageTensorParallel {
  ProcessGroup* tp = nullptr;
  bool sequence_parallel = false;
};

class PipelineStage : public nn::Module {
 public:
  // Builds layers [range.start, range.end) of the GPT of cfg, and nothing else:
  // this rank's tp shards of them when tp.tp has more than one rank.
  PipelineStage(const nn::GPTConfig& cfg, LayerRange range, StageTensorParallel tp = {});
  // Builds the layers of every chunk (ascending, non-overlapping ranges), and nothing else.
  PipelineStage(const nn::GPTConfig& cfg, std::vector<LayerRange> chunks, StageTensorParallel tp = {});

  // Holds the embedding (the first virtual stage) / the head (the last one).
  bool is_first_stage() const { return chunks_.front().start == 0; }
  bool is_last_stage() const { return chunks_.back().end == cfg_.num_layers(); }
  int num_chunks() const { return int(chunks_.size()); }
  bool chunk_is_first(int chunk) const { return range(chunk).start == 0; }
  bool chunk_is_last(int chunk) const { return range(chunk).end == cfg_.num_layers(); }
  LayerRange range(int chunk = 0) const { return chunks_.at(size_t(chunk)); }
  const std::vector<LayerRange>& chunks() const { return chunks_; }
  const nn::GPTConfig& config() const { return cfg_; }
  // Every chunk's layers, chunk after chunk: layers()[k] is layer chunks()[0].start + k, and so on.
  const std::vector<std::shared_ptr<nn::Layer>>& layers() const { return layers_; }

  // Runs chunk's layers in order. On every virtual stage but the first, input
  // is a tensor received from the previous one: a leaf, which this marks
  // requires_grad so that backward leaves d loss / d input in its .grad.
  // Virtual so that a subclass can add work to every micro-batch
  // (bench_pipeline_memory's simulated compute, which times the schedule alone).
  virtual Tensor forward(const Tensor& input, int chunk = 0);

  // picotron's PipelineParallel.backward: backward(output, output_grad), or on
  // the last stage (output = the scalar loss, output_grad undefined) plain
  // backward(loss). Returns input's gradient, undefined on the first stage
  // (token ids have none).
  Tensor backward(const Tensor& input, const Tensor& output, const Tensor& output_grad, int chunk = 0);

  // The activation sent between stages for token ids of shape [B, T]:
  // [B, T, C], or [B, T / tp, C] under sequence parallelism (this rank's part of the sequence).
  Shape activation_shape(const Shape& ids) const;

  // The loss of the last stage's logits against targets [B, T]: the mean
  // cross-entropy (with tp, vocab-parallel over logits [B, T, V_pad / tp]).
  Tensor loss(const Tensor& logits, const Tensor& targets) const;

  // ---- tensor parallelism (all empty / identity without it) ----
  bool tensor_parallel() const { return tp_.tp != nullptr; }
  ProcessGroup* tp_group() const { return tp_.tp; }
  bool sequence_parallel() const { return tp_.sequence_parallel; }
  const ShardMaps& shard_maps() const { return shard_maps_; }
  // The params every tp rank holds whole: layernorms, row-parallel biases, wpe.
  // Counted once in the grad norm (tp rank 0's copies).
  nn::NamedTensors tp_replicated_params() const;
  // Under sequence parallelism, those whose gradients are partial sums over
  // tp (each rank saw T/tp of the tokens): all but wpe, which is added before
  // the scatter along T. Summed over tp after backward.
  std::vector<Tensor> sequence_parallel_partial_params() const;
  // state_dict() with every tp shard joined into its full tensor (gather_full).
  // Collective over tp; without tp, state_dict() itself.
  nn::NamedTensors full_state_dict();

  // Also sets the layer objects themselves (the embedding and the head are
  // registered through their sub-modules, not as children).
  void train(bool on = true) override;

  // The token-embedding weight this stage holds: wte on the first stage, the
  // head's copy on the last (the same tensor when one stage holds both);
  // undefined on middle stages.
  Tensor embedding_weight() const;

 private:
  nn::GPTConfig cfg_;
  std::vector<LayerRange> chunks_;
  std::vector<std::shared_ptr<nn::Layer>> layers_;
  StageTensorParallel tp_;
  ShardMaps shard_maps_;
  std::vector<size_t> first_layer_;  // chunk c's layers are layers_[first_layer_[c] ..]
};

// Parameter count of each GPT layer, the weights partition_balanced cuts by:
// embedding V C + block_size C, each block 12 C² + 13 C, head 2 C + V C (its
// own copy of wte counts: a last stage holds it).
std::vector<int64_t> gpt_layer_param_counts(const nn::GPTConfig& cfg);

}  // namespace loom::parallel
