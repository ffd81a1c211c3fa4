// ModelChunks: what every rank trains - the layers of the GPT at its (pp, tp)
// coordinate, as one Module (Megatron's list of model chunks; picotron's
// PipelineParallel wrapping its slice of decoder layers). A single process is
// one chunk holding every layer; a pipeline rank holds one range of layers, or
// v ranges with virtual stages (interleaved 1F1B); under tensor parallelism
// each layer is this rank's tp shard of it. The model does not know which:
// the layers are made by a LayerBuilder (the full layers of nn/gpt.h by
// default; tensor_parallel/sharding.h passes the shards), and the first and
// last layer answer for the token embedding and the loss themselves
// (nn::EmbeddingLayer, nn::HeadLayer). Only those layers are ever built, so a
// rank's parameter memory is its own part's, not the model's.
//
// Per micro-batch a chunk runs
//   forward(input, c):  first chunk of the model: token ids [B, T] int64 -> [B, T, C]
//                       any other chunk: the activation received [B, T, C] -> [B, T, C]
//                       last chunk of the model: ... -> logits [B, T, V]
//   backward(input, output, output_grad, c): back-propagates the gradient
//                       received from the next chunk (or, on the last, the
//                       loss) and returns d loss / d input, to send upstream.
//
// Parameter names and order are the full model's (nn/gpt.h), in layer order
// whatever the chunks: rank 0 of pp 2 x v 2 over 8 layers holds wte, wpe,
// blocks.0, blocks.3, blocks.4; a last stage without layer 0 has ..., ln_f.*
// and wte.weight - the head's own copy of the token embedding, under the
// embedding's name because it *is* that weight (kept equal to the first
// stage's by finalize_model_grads.h). So the data-parallel buffer, the
// optimizer and the checkpoint see one list, as for nn::GPT, and a single
// chunk of every layer has nn::GPT's names in nn::GPT's order.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "autograd/engine.h"
#include "nn/gpt.h"
#include "parallel/pipeline_parallel/partition.h"

namespace loom::parallel {

// How a chunk's layers are made.
struct LayerBuilder {
  // Layers [begin, end) of the GPT (nn::build_gpt_layers when empty).
  std::function<std::vector<std::shared_ptr<nn::Layer>>(int64_t begin, int64_t end)> build;
  // Activations between chunks hold T / sequence_split tokens of each
  // sequence (sequence parallelism: T / tp).
  int64_t sequence_split = 1;
};

class ModelChunks : public nn::Module {
 public:
  // The layers of every chunk (ascending, non-overlapping ranges), and nothing else.
  ModelChunks(const nn::GPTConfig& cfg, std::vector<LayerRange> chunks, LayerBuilder builder = {});
  // One chunk: layers [range.start, range.end) (a plain pipeline stage; the
  // whole model on one process is {0, cfg.num_layers()}).
  ModelChunks(const nn::GPTConfig& cfg, LayerRange range, LayerBuilder builder = {});

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

  // Runs chunk's layers in order, each with its forward pre-hooks. On every
  // chunk but the model's first, input was received from the previous one: a
  // leaf, which this marks requires_grad so that backward leaves d loss /
  // d input in its .grad.
  Tensor forward(const Tensor& input, int chunk = 0);

  // picotron's PipelineParallel.backward: backward(output, output_grad), or on
  // the last chunk (output = the scalar loss, output_grad undefined) plain
  // backward(loss). Returns input's gradient, undefined on the first chunk
  // (token ids have none). With weight_grads, only B of a zero-bubble
  // schedule (autograd/engine.h): the weights' gradients are left there, for W.
  Tensor backward(const Tensor& input, const Tensor& output, const Tensor& output_grad, int chunk = 0,
                  autograd::WeightGrads* weight_grads = nullptr);

  // The activation between chunks for token ids of shape [B, T]: [B, T / sequence_split, C].
  Shape activation_shape(const Shape& ids) const;

  // The head's loss of the last chunk's logits against targets [B, T] (the
  // mean cross-entropy; vocab-parallel under tp).
  Tensor loss(const Tensor& logits, const Tensor& targets) const;

  // The token-embedding weight this rank holds: wte on the first stage, the
  // head's copy on the last (the same tensor when one rank holds both);
  // undefined in between, and everywhere when the head is untied (Llama).
  Tensor embedding_weight() const;

  // Also sets the layer objects themselves (the embedding and the head are
  // registered through their sub-modules, not as children).
  void train(bool on = true) override;

 private:
  nn::GPTConfig cfg_;
  std::vector<LayerRange> chunks_;
  int64_t sequence_split_;
  std::vector<std::shared_ptr<nn::Layer>> layers_;
  std::vector<size_t> first_layer_;  // chunk c's layers are layers_[first_layer_[c] ..]
};

// Parameter count of each GPT layer, the weights partition_balanced cuts by:
// embedding V C + block_size C, each block 12 C² + 13 C, head 2 C + V C (its
// own copy of wte counts: a last stage holds it).
std::vector<int64_t> gpt_layer_param_counts(const nn::GPTConfig& cfg);

}  // namespace loom::parallel
