#include "parallel/pipeline_parallel/pipeline_stage.h"

#include <sstream>

#include "autograd/engine.h"
#include "autograd/variable.h"
#include "nn/loss.h"
#include "parallel/tensor_parallel/gpt.h"

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
// prefix "" -> its own children go straight onto the stage (wte, wpe, drop /
// ln_f, wte), prefix "blocks.3." -> the layer becomes child "3" of "blocks".
void register_layer(nn::Module& stage, const std::string& prefix, const std::shared_ptr<nn::Layer>& layer) {
  if (prefix.empty()) {
    for (const auto& [name, m] : layer->named_children())
      if (!child(stage, name)) stage.register_module(name, m);  // the tied wte is registered once
    return;
  }
  std::vector<std::string> path;
  std::stringstream ss(prefix);
  for (std::string part; std::getline(ss, part, '.');) path.push_back(part);
  nn::Module* parent = &stage;
  for (size_t i = 0; i + 1 < path.size(); ++i) {
    std::shared_ptr<nn::Module> next = child(*parent, path[i]);
    if (!next) next = parent->register_module(path[i], std::make_shared<Container>());
    parent = next.get();
  }
  parent->register_module(path.back(), layer);
}

}  // namespace

PipelineStage::PipelineStage(const nn::GPTConfig& cfg, LayerRange range, StageTensorParallel tp)
    : PipelineStage(cfg, std::vector<LayerRange>{range}, tp) {}

PipelineStage::PipelineStage(const nn::GPTConfig& cfg, std::vector<LayerRange> chunks, StageTensorParallel tp)
    : cfg_(cfg), chunks_(std::move(chunks)) {
  LOOM_CHECK(!chunks_.empty(), "PipelineStage: no layers");
  const bool split = tp.tp && tp.tp->size() > 1;  // tensor parallel: each layer's tp shards
  if (split) tp_ = tp;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const LayerRange r = chunks_[c];
    LOOM_CHECK(r.start < r.end && (c == 0 || chunks_[c - 1].end <= r.start), "PipelineStage: chunk ", c,
               " [", r.start, ", ", r.end, ") is empty or not after the chunk before it");
    first_layer_.push_back(layers_.size());
    // The full layers (each from its own generator, nn/gpt.h); with tp, this
    // rank's shards cut from them, and then - the same layers refilled with
    // element indices - where each shard came from.
    std::vector<std::shared_ptr<nn::Layer>> full = nn::build_gpt_layers(cfg, r.start, r.end);
    if (split) {
      check_tensor_parallel_split(cfg, *tp.tp, tp.sequence_parallel);
      std::vector<std::shared_ptr<nn::Layer>> shards =
          cut_gpt_layers_for_tp(full, cfg, r.start, *tp.tp, tp.sequence_parallel);
      layers_.insert(layers_.end(), shards.begin(), shards.end());
      shard_maps_.merge(tensor_parallel_shard_maps(full, cfg, r.start, *tp.tp, tp.sequence_parallel));
    } else {
      layers_.insert(layers_.end(), full.begin(), full.end());
    }
    for (int64_t i = r.start; i < r.end; ++i)
      register_layer(*this, nn::gpt_layer_prefix(cfg, i), layers_[first_layer_[c] + size_t(i - r.start)]);
  }
}

Tensor PipelineStage::forward(const Tensor& input, int chunk) {
  const LayerRange r = range(chunk);
  LOOM_CHECK(input.defined(), "PipelineStage::forward: layers [", r.start, ", ", r.end, "): input is undefined");
  if (!chunk_is_first(chunk)) autograd::set_requires_grad(input);
  Tensor x = input;
  // (*layer)(x): forward with the layer's forward pre-hooks (--overlap-param-gather's waits)
  for (size_t k = 0; k < size_t(r.size()); ++k) x = (*layers_[first_layer_[size_t(chunk)] + k])(x);
  return x;
}

Tensor PipelineStage::backward(const Tensor& input, const Tensor& output, const Tensor& output_grad, int chunk) {
  if (output_grad.defined()) {
    autograd::backward({output}, {output_grad});
  } else {
    LOOM_CHECK(chunk_is_last(chunk) && output.numel() == 1, "PipelineStage::backward: layers [", range(chunk).start,
               ", ", range(chunk).end, ") got no output gradient; only the last stage starts from its (scalar) loss");
    autograd::backward(output);
  }
  if (chunk_is_first(chunk)) return Tensor();
  return autograd::grad(input);
}

void PipelineStage::train(bool on) {
  Module::train(on);
  for (const auto& layer : layers_) layer->train(on);
}

Tensor PipelineStage::embedding_weight() const {
  if (tensor_parallel()) {
    if (is_first_stage()) return std::static_pointer_cast<TensorParallelEmbedding>(layers_.front())->wte->weight;
    if (is_last_stage()) return std::static_pointer_cast<TensorParallelHead>(layers_.back())->wte->weight;
    return Tensor();
  }
  if (is_first_stage()) return std::static_pointer_cast<nn::GPTEmbedding>(layers_.front())->wte->weight;
  if (is_last_stage()) return std::static_pointer_cast<nn::GPTHead>(layers_.back())->wte->weight;
  return Tensor();
}

Shape PipelineStage::activation_shape(const Shape& ids) const {
  LOOM_CHECK(ids.size() == 2, "PipelineStage::activation_shape: token ids must be [B, T], got ", ids);
  const int64_t T = tp_.sequence_parallel ? ids[1] / tp_.tp->size() : ids[1];
  return {ids[0], T, cfg_.n_embd};
}

Tensor PipelineStage::loss(const Tensor& logits, const Tensor& targets) const {
  LOOM_CHECK(is_last_stage(), "PipelineStage::loss: layers [", range().start, ", ", chunks_.back().end,
             ") are not the last stage; only it has logits");
  if (!tensor_parallel()) return nn::cross_entropy_loss(logits, targets);
  const auto& head = static_cast<const TensorParallelHead&>(*layers_.back());
  return tensor_parallel_loss(logits, targets, head, cfg_.vocab_size);
}

nn::NamedTensors PipelineStage::tp_replicated_params() const {
  nn::NamedTensors out;
  for (const auto& [name, p] : named_parameters())
    if (auto it = shard_maps_.find(name); it != shard_maps_.end() && it->second.replicated) out.emplace_back(name, p);
  return out;
}

std::vector<Tensor> PipelineStage::sequence_parallel_partial_params() const {
  std::vector<Tensor> out;
  if (!tp_.sequence_parallel) return out;
  for (const auto& [name, p] : named_parameters())
    if (auto it = shard_maps_.find(name); it != shard_maps_.end() && it->second.replicated && name != "wpe.weight")
      out.push_back(p);
  return out;
}

nn::NamedTensors PipelineStage::full_state_dict() {
  if (!tensor_parallel()) return state_dict();
  nn::NamedTensors out;
  for (const auto& [name, t] : state_dict()) out.emplace_back(name, gather_full(t, shard_maps_.at(name), *tp_.tp));
  return out;
}

std::vector<int64_t> gpt_layer_param_counts(const nn::GPTConfig& cfg) {
  const int64_t V = cfg.vocab_size, C = cfg.n_embd;
  std::vector<int64_t> counts{V * C + cfg.block_size * C};
  for (int64_t i = 0; i < cfg.n_layer; ++i) counts.push_back(12 * C * C + 13 * C);
  counts.push_back(2 * C + V * C);
  return counts;
}

}  // namespace loom::parallel
