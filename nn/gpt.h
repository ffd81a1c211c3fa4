// GPT (GPT-2 architecture, nanoGPT's names): token + learned position
// embeddings, n_layer pre-LN Blocks, a final LayerNorm, and an LM head tied to
// the token embedding (logits = x @ wte.weightᵀ).
//
// The model is an ordered list of Layers, each Tensor -> Tensor, so a pipeline
// stage is a slice of it with no special cases:
//   layer 0            GPTEmbedding  idx [B, T] int64 -> x [B, T, C]
//   layer 1 .. L       Block         x [B, T, C] -> x [B, T, C]
//   layer L + 1        GPTHead       x [B, T, C] -> logits [B, T, V]
//
// Parameter names and order (the checkpoint and gradient-bucket layout):
//   wte.weight [V, C], wpe.weight [block_size, C],
//   for i in 0..L-1: blocks.i.{ln_1.weight, ln_1.bias, attn.c_attn.weight,
//     attn.c_attn.bias, attn.c_proj.weight, attn.c_proj.bias, ln_2.weight,
//     ln_2.bias, mlp.c_fc.weight, mlp.c_fc.bias, mlp.c_proj.weight, mlp.c_proj.bias},
//   ln_f.weight, ln_f.bias.
// The LM head's weight is wte.weight itself, so it appears once. Total:
//   V C + block_size C + L (12 C² + 13 C) + 2 C.
//
// The Llama set (GPTConfig::set_arch("llama"), train_gpt --arch llama) changes, in
// the same layers: RMSNorm for every norm, no wpe (rotary embeddings on q and k
// instead), SwiGLU MLP (mlp.c_gate, mlp.c_fc, mlp.c_proj), grouped-query
// attention (c_attn [(H + 2 Hkv) hd, C]), no biases, and an untied head with
// its own lm_head.weight [V, C] (listed after ln_f.weight). With experts
// (GPTConfig::moe, nn/moe.h: Mixtral) each block's mlp.* is moe.gate.weight [E, C],
// moe.experts.M.{w1, w2, w3}.weight and, with shared experts,
// moe.shared_experts.{c_gate, c_fc, c_proj}.weight. gpt_block_params() counts each variant.
//
// Initialisation (GPT-2): Linear and Embedding weights ~ N(0, 0.02), biases 0,
// LayerNorm 1 and 0, residual projections (attn.c_proj.weight,
// mlp.c_proj.weight) ~ N(0, 0.02 / sqrt(2 n_layer)) because each block adds
// two of them to the residual stream. Layer i draws only from its own
// Generator, layer_generator(seed, i), in registration order, so a stage that
// builds layers [a, b) gets exactly the weights the full model has.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nn/block.h"
#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/layernorm.h"
#include "nn/linear.h"
#include "nn/module.h"

namespace loom::nn {

struct GPTConfig {
  int64_t vocab_size = 65;
  int64_t block_size = 64;  // longest sequence (rows of wpe)
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  double dropout = 0.0;
  uint64_t seed = 1337;

  // ---- architecture: GPT-2's set by default; set_arch("llama") picks Llama's ----
  bool rmsnorm = false;           // norms: LayerNorm (GPT-2) or RMSNorm (Llama)
  double norm_eps = 1e-5;
  bool rope = false;              // positions: learned wpe (GPT-2) or rotary embeddings on q, k (Llama)
  double rope_base = 10000.0;     // RoPE's base θ (Llama 2: 10000, Llama 3: 500000)
  bool swiglu = false;            // MLP: GELU (GPT-2) or SwiGLU (Llama)
  int64_t mlp_hidden = 0;         // the MLP's width; 0: 4C for GELU, 8C/3 rounded up to a multiple of 8 for SwiGLU
  int64_t n_kv_head = 0;          // key/value heads; 0: n_head; 1: multi-query; between: grouped-query
  bool tied_embeddings = true;    // the head reuses wte (GPT-2) or has its own lm_head (Llama)
  bool bias = true;               // biases on the attention and MLP linears (Llama has none)
  // ---- mixture of experts (nn/moe.h): moe.experts > 0 puts E SwiGLU experts of width
  // ffn_hidden() in every block's MLP place (Mixtral); Llama's set only ----
  MoEOptions moe = {};

  // "gpt2" or "llama": sets the fields above to that family's set (sizes unchanged).
  void set_arch(const std::string& arch);
  std::string arch() const;       // "gpt2", "llama", or "custom" for any other mix
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t ffn_hidden() const;     // the MLP width, mlp_hidden or its default
  BlockOptions block_options() const;
  // (As a checkpoint's metadata: nn/arch_metadata.h.)

  int64_t num_layers() const { return n_layer + 2; }  // embedding + blocks + head
  void validate() const;                              // throws on a non-positive size, C % n_head != 0, ...
};

// Parameter counts of the layers (the balanced pipeline partition weighs by these):
int64_t gpt_embedding_params(const GPTConfig& cfg);  // wte (+ wpe)
int64_t gpt_block_params(const GPTConfig& cfg);      // one block
int64_t gpt_head_params(const GPTConfig& cfg);       // ln_f + the LM head (its own lm_head, or the tied wte's copy)

// The generator layer i draws its initial weights (and dropout seeds) from.
Generator layer_generator(uint64_t seed, int64_t layer_index);

// What a model of layer chunks asks of its first and last layer, whatever cut
// them (tensor parallelism's shards answer the same questions): the token
// embedding each holds - one weight, tied across pipeline stages - and the
// head's loss. parallel/model_chunks.h uses these instead of the concrete types
// (and parallel/ asks a block through nn::BlockLayer, nn/block.h).
struct EmbeddingLayer : Layer {
  virtual Tensor token_embedding() const = 0;  // wte.weight [V, C] (this rank's rows under tp)
  // The positions of the T tokens of each sequence the layer sees, [T] int64;
  // undefined: 0..T-1. Context parallelism sets its rank's zig-zag chunks'
  // (parallel/context_parallel/zigzag.h), so wpe adds the tokens' true positions.
  Tensor position_ids;
  Tensor positions(int64_t T) const {
    if (!position_ids.defined()) return arange(T);
    LOOM_CHECK(position_ids.numel() == T, "EmbeddingLayer: ", position_ids.numel(),
               " position ids (this rank's tokens of a sequence) for sequences of ", T, " tokens");
    return position_ids;
  }
};
struct HeadLayer : Layer {
  // The head's wte.weight: the embedding's, or its copy; undefined for an untied head (Llama's lm_head).
  virtual Tensor token_embedding() const = 0;
  // Drops the head's own copy of wte and uses the embedding's module instead:
  // for a stage that holds both ends of the model in different chunks (a V).
  virtual void tie_to(const EmbeddingLayer& embedding) = 0;
  // The mean cross-entropy of this layer's logits against targets [B, T].
  virtual Tensor loss(const Tensor& logits, const Tensor& targets) const = 0;
};

// Layer 0: x = dropout(wte[idx] + wpe[0..T-1]); with RoPE, x = dropout(wte[idx]).
struct GPTEmbedding : EmbeddingLayer {
  int64_t block_size;
  std::shared_ptr<Embedding> wte;  // [V, C]; drawn first, so GPTHead can rebuild it
  std::shared_ptr<Embedding> wpe;  // [block_size, C]; null with RoPE
  std::shared_ptr<Dropout> drop;

  explicit GPTEmbedding(const GPTConfig& cfg);
  // idx: [B, T] int64 (T <= block_size) -> [B, T, C]
  Tensor forward(const Tensor& idx) override;
  Tensor token_embedding() const override { return wte->weight; }
};

// Layer L + 1: logits = ln_f(x) @ wte.weightᵀ. Registration order: ln_f, wte,
// so its parameters are ln_f.weight, ln_f.bias, wte.weight. Untied (Llama):
// logits = ln_f(x) @ lm_head.weightᵀ, parameters ln_f.weight, lm_head.weight.
struct GPTHead : HeadLayer {
  std::shared_ptr<LayerNorm> ln_f;    // or an RMSNorm (Llama)
  std::shared_ptr<Embedding> wte;     // the token embedding: shared, or an identical copy; null when untied
  std::shared_ptr<Linear> lm_head;    // [V, C], no bias: the untied head's own weight; null when tied

  // Tied: uses the embedding layer's wte module (same weight tensor).
  GPTHead(const GPTConfig& cfg, std::shared_ptr<Embedding> tied_wte);
  // Standalone (a last pipeline stage without layer 0): its own wte, drawn from
  // layer_generator(seed, 0) exactly as GPTEmbedding draws it, so both start
  // identical. Untied: lm_head, drawn from the head's own layer_generator.
  explicit GPTHead(const GPTConfig& cfg);
  // x: [B, T, C] -> logits [B, T, V]
  Tensor forward(const Tensor& x) override;
  Tensor token_embedding() const override { return wte ? wte->weight : Tensor(); }  // undefined when untied
  void tie_to(const EmbeddingLayer& embedding) override;  // embedding: a GPTEmbedding
  Tensor loss(const Tensor& logits, const Tensor& targets) const override;  // nn::cross_entropy_loss
};

// Layers [begin, end) of the list above. When the slice holds both layer 0 and
// layer L + 1, the head is tied to the embedding's wte.
std::vector<std::shared_ptr<Layer>> build_gpt_layers(const GPTConfig& cfg, int64_t begin, int64_t end);

// The prefix that turns layer i's own parameter names into the full model's:
// "" for the embedding and the head, "blocks.<i-1>." for a block.
std::string gpt_layer_prefix(const GPTConfig& cfg, int64_t layer_index);

// The whole model: the layer list run in order. Its children are registered
// under nanoGPT's names (wte, wpe, drop, blocks, ln_f), which are the same
// module objects the layers hold.
class GPT : public Layer {
 public:
  explicit GPT(const GPTConfig& cfg);

  // idx: [B, T] int64 -> logits [B, T, V]
  Tensor forward(const Tensor& idx) override;

  // Also sets the mode of the layer objects themselves (GPTEmbedding and
  // GPTHead are not children; their sub-modules are).
  void train(bool on = true) override;

  const GPTConfig& config() const { return cfg_; }
  const std::vector<std::shared_ptr<Layer>>& layers() const { return layers_; }
  std::shared_ptr<GPTEmbedding> embedding() const;
  std::shared_ptr<Block> block(int64_t i) const;
  std::shared_ptr<GPTHead> head() const;

 private:
  GPTConfig cfg_;
  std::vector<std::shared_ptr<Layer>> layers_;
};

}  // namespace loom::nn
