#include "nn/gpt.h"

#include <cmath>

#include "nn/loss.h"

namespace loom::nn {

void GPTConfig::validate() const {
  LOOM_CHECK(vocab_size > 0 && block_size > 0 && n_layer > 0 && n_head > 0 && n_embd > 0,
             "GPTConfig: sizes must be positive (vocab_size ", vocab_size, ", block_size ", block_size, ", n_layer ",
             n_layer, ", n_head ", n_head, ", n_embd ", n_embd, ")");
  LOOM_CHECK(n_embd % n_head == 0, "GPTConfig: n_embd ", n_embd, " is not divisible by n_head ", n_head);
  LOOM_CHECK(dropout >= 0.0 && dropout < 1.0, "GPTConfig: dropout must be in [0, 1), got ", dropout);
}

// One stream per layer: seeded with the first draw of Generator(seed), plus the
// layer index. Independent of how many layers a process builds.
Generator layer_generator(uint64_t seed, int64_t layer_index) {
  return Generator(Generator(seed).next_u64() + uint64_t(layer_index));
}

// ---- layer 0 ----------------------------------------------------------------------

GPTEmbedding::GPTEmbedding(const GPTConfig& cfg) : block_size(cfg.block_size) {
  Generator gen = layer_generator(cfg.seed, 0);
  wte = register_module("wte", std::make_shared<Embedding>(cfg.vocab_size, cfg.n_embd, gen));
  wpe = register_module("wpe", std::make_shared<Embedding>(cfg.block_size, cfg.n_embd, gen));
  drop = register_module("drop", std::make_shared<Dropout>(cfg.dropout, gen.next_u64()));
}

Tensor GPTEmbedding::forward(const Tensor& idx) {
  LOOM_CHECK(idx.dim() == 2 && is_integer(idx.dtype()), "GPTEmbedding: expected token ids [B, T] int64, got ",
             idx.shape(), " ", dtype_name(idx.dtype()));
  const int64_t T = idx.size(1);
  LOOM_CHECK(T <= block_size, "GPTEmbedding: sequence length ", T, " exceeds block_size ", block_size);
  Tensor tok = wte->forward(idx);         // [B, T, C]
  Tensor pos = wpe->forward(positions(T));  // [T, C], broadcast over the batch
  return drop->forward(autograd::add(tok, pos));
}

// ---- layer L + 1 ------------------------------------------------------------------

GPTHead::GPTHead(const GPTConfig& cfg, std::shared_ptr<Embedding> tied_wte) {
  LOOM_CHECK(tied_wte && tied_wte->weight.size(0) == cfg.vocab_size && tied_wte->weight.size(1) == cfg.n_embd,
             "GPTHead: the tied embedding must be [", cfg.vocab_size, ", ", cfg.n_embd, "]");
  ln_f = register_module("ln_f", std::make_shared<LayerNorm>(cfg.n_embd));
  wte = register_module("wte", std::move(tied_wte));
}

GPTHead::GPTHead(const GPTConfig& cfg) {
  Generator gen = layer_generator(cfg.seed, 0);  // wte is the first draw of layer 0
  ln_f = register_module("ln_f", std::make_shared<LayerNorm>(cfg.n_embd));
  wte = register_module("wte", std::make_shared<Embedding>(cfg.vocab_size, cfg.n_embd, gen));
}

Tensor GPTHead::forward(const Tensor& x) {
  Tensor h = ln_f->forward(x);                                             // [B, T, C]
  return autograd::linear(h, wte->weight, Tensor());  // h @ wteᵀ: [B, T, C] @ [C, V] -> [B, T, V]
}

Tensor GPTHead::loss(const Tensor& logits, const Tensor& targets) const {
  return cross_entropy_loss(logits, targets);
}

// ---- the layer list ---------------------------------------------------------------

std::vector<std::shared_ptr<Layer>> build_gpt_layers(const GPTConfig& cfg, int64_t begin, int64_t end) {
  cfg.validate();
  const int64_t n = cfg.num_layers();
  LOOM_CHECK(0 <= begin && begin < end && end <= n, "build_gpt_layers: range [", begin, ", ", end,
             ") is not a non-empty slice of the ", n,
             " layers (embedding, ", cfg.n_layer, " blocks, head)");
  const double proj_std = 0.02 / std::sqrt(2.0 * double(cfg.n_layer));
  std::vector<std::shared_ptr<Layer>> layers;
  std::shared_ptr<GPTEmbedding> embedding;
  for (int64_t i = begin; i < end; ++i) {
    if (i == 0) {
      embedding = std::make_shared<GPTEmbedding>(cfg);
      layers.push_back(embedding);
    } else if (i == n - 1) {
      layers.push_back(embedding ? std::make_shared<GPTHead>(cfg, embedding->wte) : std::make_shared<GPTHead>(cfg));
    } else {
      Generator gen = layer_generator(cfg.seed, i);
      layers.push_back(std::make_shared<Block>(cfg.n_embd, cfg.n_head, gen, proj_std, cfg.dropout));
    }
  }
  return layers;
}

std::string gpt_layer_prefix(const GPTConfig& cfg, int64_t layer_index) {
  LOOM_CHECK(0 <= layer_index && layer_index < cfg.num_layers(), "gpt_layer_prefix: layer ", layer_index,
             " out of range [0, ", cfg.num_layers(), ")");
  if (layer_index == 0 || layer_index == cfg.num_layers() - 1) return "";
  return "blocks." + std::to_string(layer_index - 1) + ".";
}

// ---- the model --------------------------------------------------------------------

GPT::GPT(const GPTConfig& cfg) : cfg_(cfg), layers_(build_gpt_layers(cfg, 0, cfg.num_layers())) {
  register_module("wte", embedding()->wte);
  register_module("wpe", embedding()->wpe);
  register_module("drop", embedding()->drop);
  auto blocks = register_module("blocks", std::make_shared<ModuleList<Block>>());
  for (int64_t i = 0; i < cfg.n_layer; ++i) blocks->push_back(block(i));
  register_module("ln_f", head()->ln_f);
}

Tensor GPT::forward(const Tensor& idx) {
  Tensor x = idx;
  for (const auto& layer : layers_) x = (*layer)(x);  // runs each layer's forward pre-hooks
  return x;
}

void GPT::train(bool on) {
  Module::train(on);
  for (const auto& layer : layers_) layer->train(on);
}

std::shared_ptr<GPTEmbedding> GPT::embedding() const { return std::static_pointer_cast<GPTEmbedding>(layers_.front()); }

std::shared_ptr<Block> GPT::block(int64_t i) const {
  LOOM_CHECK(0 <= i && i < cfg_.n_layer, "GPT::block: index ", i, " out of range [0, ", cfg_.n_layer, ")");
  return std::static_pointer_cast<Block>(layers_[size_t(i + 1)]);
}

std::shared_ptr<GPTHead> GPT::head() const { return std::static_pointer_cast<GPTHead>(layers_.back()); }

}  // namespace loom::nn
