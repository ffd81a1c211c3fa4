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
  LOOM_CHECK(n_kv_head >= 0 && n_head % kv_heads() == 0, "GPTConfig: n_head ", n_head,
             " is not divisible by n_kv_head ", n_kv_head, " (each key/value head serves n_head / n_kv_head query heads)");
  LOOM_CHECK(!rope || (n_embd / n_head) % 2 == 0, "GPTConfig: rotary embeddings need an even head size, got n_embd ",
             n_embd, " / n_head ", n_head, " = ", n_embd / n_head);
  LOOM_CHECK(!rope || rope_base > 1.0, "GPTConfig: rope_base must be > 1, got ", rope_base);
  LOOM_CHECK(mlp_hidden >= 0, "GPTConfig: mlp_hidden must be >= 0 (0: the default width), got ", mlp_hidden);
  LOOM_CHECK(norm_eps > 0.0, "GPTConfig: norm_eps must be > 0, got ", norm_eps);
  if (moe.experts == 0) return;
  LOOM_CHECK(moe.experts > 0 && 1 <= moe.experts_per_token && moe.experts_per_token <= moe.experts,
             "GPTConfig: ", moe.experts_per_token, " experts per token of ", moe.experts,
             " experts (expected 1 <= k <= E)");
  LOOM_CHECK(swiglu && !bias, "GPTConfig: experts are SwiGLU MLPs without biases (Mixtral's); a ", arch(),
             " model has ", swiglu ? "biases" : "a GELU MLP", " (use the llama architecture)");
  LOOM_CHECK(moe.shared_experts >= 0 && moe.capacity_factor >= 0 && moe.aux_loss_coef >= 0 && moe.z_loss_coef >= 0 &&
                 moe.bias_update_rate >= 0,
             "GPTConfig: the MoE options must be >= 0 (shared experts ", moe.shared_experts, ", capacity factor ",
             moe.capacity_factor, ", aux loss coef ", moe.aux_loss_coef, ", z-loss coef ", moe.z_loss_coef,
             ", bias update rate ", moe.bias_update_rate, ")");
}

void GPTConfig::set_arch(const std::string& name) {
  LOOM_CHECK(name == "gpt2" || name == "llama", "GPTConfig: unknown architecture '", name,
             "' (expected gpt2 or llama)");
  const bool llama = name == "llama";
  rmsnorm = rope = swiglu = llama;
  tied_embeddings = bias = !llama;
}

std::string GPTConfig::arch() const {
  if (!rmsnorm && !rope && !swiglu && tied_embeddings && bias) return "gpt2";
  if (rmsnorm && rope && swiglu && !tied_embeddings && !bias) return "llama";
  return "custom";
}

int64_t GPTConfig::ffn_hidden() const {
  if (mlp_hidden > 0) return mlp_hidden;
  if (!swiglu) return 4 * n_embd;
  // Llama: 2/3 of 4C, so SwiGLU's three matrices hold what GELU's two do;
  // rounded up to a multiple of 8 here (Llama rounds to 256).
  return (8 * n_embd / 3 + 7) / 8 * 8;
}

BlockOptions GPTConfig::block_options() const {
  BlockOptions o;
  o.rmsnorm = rmsnorm;
  o.norm_eps = norm_eps;
  o.rope_base = rope ? rope_base : 0.0;
  o.n_kv_head = kv_heads();
  o.swiglu = swiglu;
  o.mlp_hidden = ffn_hidden();
  o.bias = bias;
  o.moe = moe;
  return o;
}

int64_t gpt_embedding_params(const GPTConfig& cfg) {
  return cfg.vocab_size * cfg.n_embd + (cfg.rope ? 0 : cfg.block_size * cfg.n_embd);
}

int64_t gpt_block_params(const GPTConfig& cfg) {
  const int64_t C = cfg.n_embd, F = cfg.ffn_hidden(), kv = cfg.kv_heads() * (C / cfg.n_head);
  const int64_t norms = 2 * (cfg.rmsnorm ? C : 2 * C);
  const int64_t attn = (C + 2 * kv) * C + C * C + (cfg.bias ? C + 2 * kv + C : 0);
  const int64_t mlp = (cfg.swiglu ? 3 : 2) * C * F + (cfg.bias ? (cfg.swiglu ? 2 : 1) * F + C : 0);
  if (cfg.moe.experts > 0)  // the gate [E, C], E experts' w1, w2, w3, and the shared experts (one SwiGLU of S F)
    return norms + attn + cfg.moe.experts * C + (cfg.moe.experts + cfg.moe.shared_experts) * 3 * C * F;
  return norms + attn + mlp;
}

int64_t gpt_head_params(const GPTConfig& cfg) {
  return (cfg.rmsnorm ? 1 : 2) * cfg.n_embd + cfg.vocab_size * cfg.n_embd;
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
  if (!cfg.rope) wpe = register_module("wpe", std::make_shared<Embedding>(cfg.block_size, cfg.n_embd, gen));
  drop = register_module("drop", std::make_shared<Dropout>(cfg.dropout, gen.next_u64()));
}

Tensor GPTEmbedding::forward(const Tensor& idx) {
  LOOM_CHECK(idx.dim() == 2 && is_integer(idx.dtype()), "GPTEmbedding: expected token ids [B, T] int64, got ",
             idx.shape(), " ", dtype_name(idx.dtype()));
  const int64_t T = idx.size(1);
  LOOM_CHECK(T <= block_size, "GPTEmbedding: sequence length ", T, " exceeds block_size ", block_size);
  Tensor tok = wte->forward(idx);         // [B, T, C]
  if (!wpe) return drop->forward(tok);     // RoPE: positions enter in attention, on q and k
  Tensor pos = wpe->forward(positions(T));  // [T, C], broadcast over the batch
  return drop->forward(autograd::add(tok, pos));
}

// ---- layer L + 1 ------------------------------------------------------------------

GPTHead::GPTHead(const GPTConfig& cfg, std::shared_ptr<Embedding> tied_wte) {
  LOOM_CHECK(tied_wte && tied_wte->weight.size(0) == cfg.vocab_size && tied_wte->weight.size(1) == cfg.n_embd,
             "GPTHead: the tied embedding must be [", cfg.vocab_size, ", ", cfg.n_embd, "]");
  LOOM_CHECK(cfg.tied_embeddings, "GPTHead: an untied head has its own lm_head; build it with GPTHead(cfg)");
  ln_f = register_module("ln_f", make_norm(cfg.n_embd, cfg.block_options()));
  wte = register_module("wte", std::move(tied_wte));
}

GPTHead::GPTHead(const GPTConfig& cfg) {
  ln_f = register_module("ln_f", make_norm(cfg.n_embd, cfg.block_options()));
  if (cfg.tied_embeddings) {
    Generator gen = layer_generator(cfg.seed, 0);  // wte is the first draw of layer 0
    wte = register_module("wte", std::make_shared<Embedding>(cfg.vocab_size, cfg.n_embd, gen));
  } else {
    Generator gen = layer_generator(cfg.seed, cfg.num_layers() - 1);
    lm_head = register_module("lm_head", std::make_shared<Linear>(cfg.n_embd, cfg.vocab_size, gen, 0.02, false));
  }
}

void GPTHead::tie_to(const EmbeddingLayer& embedding) {
  LOOM_CHECK(wte, "GPTHead::tie_to: an untied head (lm_head) has no embedding to share");
  wte = static_cast<const GPTEmbedding&>(embedding).wte;
  replace_module("wte", wte);
}

Tensor GPTHead::forward(const Tensor& x) {
  Tensor h = ln_f->forward(x);                                   // [B, T, C]
  const Tensor& w = wte ? wte->weight : lm_head->weight;         // [V, C]
  return autograd::linear(h, w, Tensor());  // h @ wᵀ: [B, T, C] @ [C, V] -> [B, T, V]
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
      const bool tie = embedding && cfg.tied_embeddings;
      layers.push_back(tie ? std::make_shared<GPTHead>(cfg, embedding->wte) : std::make_shared<GPTHead>(cfg));
    } else {
      Generator gen = layer_generator(cfg.seed, i);
      layers.push_back(
          std::make_shared<Block>(cfg.n_embd, cfg.n_head, gen, proj_std, cfg.dropout, cfg.block_options()));
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
  if (embedding()->wpe) register_module("wpe", embedding()->wpe);
  register_module("drop", embedding()->drop);
  auto blocks = register_module("blocks", std::make_shared<ModuleList<Block>>());
  for (int64_t i = 0; i < cfg.n_layer; ++i) blocks->push_back(block(i));
  register_module("ln_f", head()->ln_f);
  if (head()->lm_head) register_module("lm_head", head()->lm_head);
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
