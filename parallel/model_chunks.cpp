#include "parallel/model_chunks.h"

#include <sstream>

#include "autograd/engine.h"
#include "autograd/variable.h"

namespace loom::parallel {

namespace {

// A plain container, so that "blocks.3" can be a child "3" of a child "blocks".
struct Container : nn::Module {};

std::shared_ptr<nn::Module> child(nn::Module& parent, const std::string& name) {
  for (const auto& [n, m] : parent.named_children())
    if (n == name) return m;
  return nullptr;
}

// Registers `layer` so that its parameters get the full model's names:
// prefix "" -> its own children go straight onto the model (wte, wpe, drop /
// ln_f, wte), prefix "blocks.3." -> the layer becomes child "3" of "blocks".
void register_layer(nn::Module& model, const std::string& prefix, const std::shared_ptr<nn::Layer>& layer) {
  if (prefix.empty()) {
    for (const auto& [name, m] : layer->named_children())
      if (!child(model, name)) model.register_module(name, m);  // the tied wte is registered once
    return;
  }
  std::vector<std::string> path;
  std::stringstream ss(prefix);
  for (std::string part; std::getline(ss, part, '.');) path.push_back(part);
  nn::Module* parent = &model;
  for (size_t i = 0; i + 1 < path.size(); ++i) {
    std::shared_ptr<nn::Module> next = child(*parent, path[i]);
    if (!next) next = parent->register_module(path[i], std::make_shared<Container>());
    parent = next.get();
  }
  parent->register_module(path.back(), layer);
}

}  // namespace

ModelChunks::ModelChunks(const nn::GPTConfig& cfg, LayerRange range, LayerBuilder builder)
    : ModelChunks(cfg, std::vector<LayerRange>{range}, std::move(builder)) {}

ModelChunks::ModelChunks(const nn::GPTConfig& cfg, std::vector<LayerRange> chunks, LayerBuilder builder)
    : cfg_(cfg), chunks_(std::move(chunks)), sequence_split_(builder.sequence_split) {
  LOOM_CHECK(!chunks_.empty(), "ModelChunks: no layers");
  LOOM_CHECK(sequence_split_ >= 1, "ModelChunks: sequence_split must be >= 1, got ", sequence_split_);
  auto build = builder.build ? builder.build : [&cfg](int64_t begin, int64_t end) {
    return nn::build_gpt_layers(cfg, begin, end);
  };
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const LayerRange r = chunks_[c];
    LOOM_CHECK(r.start < r.end && (c == 0 || chunks_[c - 1].end <= r.start), "ModelChunks: chunk ", c, " [",
               r.start, ", ", r.end, ") is empty or not after the chunk before it");
    first_layer_.push_back(layers_.size());
    std::vector<std::shared_ptr<nn::Layer>> layers = build(r.start, r.end);
    LOOM_CHECK(int64_t(layers.size()) == r.size(), "ModelChunks: the builder made ", layers.size(),
               " layers for [", r.start, ", ", r.end, ")");
    layers_.insert(layers_.end(), layers.begin(), layers.end());
    // Both ends in different chunks (a V): the head drops its copy of wte for
    // the embedding's, so the tied weight is one tensor, as in one process.
    if (c > 0 && r.end == cfg.num_layers() && is_first_stage() && cfg.tied_embeddings)
      static_cast<nn::HeadLayer&>(*layers_.back()).tie_to(static_cast<const nn::EmbeddingLayer&>(*layers_.front()));
    for (int64_t i = r.start; i < r.end; ++i)
      register_layer(*this, nn::gpt_layer_prefix(cfg, i), layers_[first_layer_[c] + size_t(i - r.start)]);
  }
}

Tensor ModelChunks::forward(const Tensor& input, int chunk) {
  const LayerRange r = range(chunk);
  LOOM_CHECK(input.defined(), "ModelChunks::forward: layers [", r.start, ", ", r.end, "): input is undefined");
  if (!chunk_is_first(chunk)) autograd::set_requires_grad(input);
  Tensor x = input;
  // (*layer)(x): forward with the layer's forward pre-hooks (--overlap-param-gather's waits)
  for (size_t k = 0; k < size_t(r.size()); ++k) x = (*layers_[first_layer_[size_t(chunk)] + k])(x);
  return x;
}

Tensor ModelChunks::backward(const Tensor& input, const Tensor& output, const Tensor& output_grad, int chunk,
                             autograd::WeightGrads* weight_grads) {
  LOOM_CHECK(output_grad.defined() || (chunk_is_last(chunk) && output.numel() == 1), "ModelChunks::backward: layers [",
             range(chunk).start, ", ", range(chunk).end,
             ") got no output gradient; only the last chunk starts from its (scalar) loss");
  const autograd::TensorList grads = output_grad.defined() ? autograd::TensorList{output_grad} : autograd::TensorList{};
  if (weight_grads) *weight_grads = autograd::Engine::backward_input({output}, grads, {input});
  else autograd::Engine::backward({output}, grads);
  if (chunk_is_first(chunk)) return Tensor();
  return autograd::grad(input);
}

void ModelChunks::train(bool on) {
  Module::train(on);
  for (const auto& layer : layers_) layer->train(on);
}

Tensor ModelChunks::embedding_weight() const {
  if (!cfg_.tied_embeddings) return Tensor();  // an untied head (Llama): nothing shared across stages
  // The first layer of the model is an nn::EmbeddingLayer and the last an
  // nn::HeadLayer, whoever built them (nn/gpt.h, tensor_parallel/gpt.h).
  if (is_first_stage()) return static_cast<const nn::EmbeddingLayer&>(*layers_.front()).token_embedding();
  if (is_last_stage()) return static_cast<const nn::HeadLayer&>(*layers_.back()).token_embedding();
  return Tensor();
}

Shape ModelChunks::activation_shape(const Shape& ids) const {
  LOOM_CHECK(ids.size() == 2, "ModelChunks::activation_shape: token ids must be [B, T], got ", ids);
  return {ids[0], ids[1] / sequence_split_, cfg_.n_embd};
}

Tensor ModelChunks::loss(const Tensor& logits, const Tensor& targets) const {
  LOOM_CHECK(is_last_stage(), "ModelChunks::loss: layers [", range().start, ", ", chunks_.back().end,
             ") do not hold the head; only the last stage has logits");
  return static_cast<const nn::HeadLayer&>(*layers_.back()).loss(logits, targets);
}

std::vector<int64_t> gpt_layer_param_counts(const nn::GPTConfig& cfg) {
  std::vector<int64_t> counts{nn::gpt_embedding_params(cfg)};  // GPT-2: V C + block_size C
  for (int64_t i = 0; i < cfg.n_layer; ++i) counts.push_back(nn::gpt_block_params(cfg));  // 12 C² + 13 C
  counts.push_back(nn::gpt_head_params(cfg));  // 2 C + V C
  return counts;
}

}  // namespace loom::parallel
