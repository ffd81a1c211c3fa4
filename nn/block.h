// One transformer block, pre-norm as GPT-2: each sub-layer reads a
// normalised copy of the residual stream and adds its output back to it.
//   x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))
// The Llama set is options of the same block (BlockOptions): RMSNorm for the
// norms, RoPE and grouped-query attention in attn, SwiGLU in mlp, no biases.
#pragma once

#include "nn/attention.h"
#include "nn/layernorm.h"
#include "nn/mlp.h"
#include "nn/moe.h"
#include "nn/rmsnorm.h"

namespace loom::nn {

// What differs between a GPT-2 block (the defaults) and a Llama block.
struct BlockOptions {
  bool rmsnorm = false;      // RMSNorm instead of LayerNorm
  double norm_eps = 1e-5;
  double rope_base = 0.0;    // > 0: rotary position embeddings on q and k with this base
  int64_t n_kv_head = 0;     // 0: n_head; fewer: grouped-query attention (1: multi-query)
  bool swiglu = false;       // SwiGLU MLP instead of GELU
  int64_t mlp_hidden = 0;    // the MLP's width F; 0: 4C
  bool bias = true;          // biases on the attention and MLP linears
  MoEOptions moe = {};       // experts > 0: a mixture of experts (nn/moe.h) instead of the MLP
};

// A LayerNorm or an RMSNorm over C features (ln_1, ln_2, the head's ln_f).
inline std::shared_ptr<LayerNorm> make_norm(int64_t C, const BlockOptions& o) {
  if (o.rmsnorm) return std::make_shared<RMSNorm>(C, o.norm_eps);
  return std::make_shared<LayerNorm>(C, o.norm_eps);
}

// What parallel/ changes inside a block, whoever cut it (tensor parallelism's
// shard answers the same; nn/gpt.h's EmbeddingLayer and HeadLayer do this for
// the first and last layer): the attention core, which selective
// recomputation wraps in a checkpoint and context parallelism replaces by the
// ring, and where RoPE's chunks start (context parallelism's zig-zag).
struct BlockLayer : Layer {
  virtual AttentionCore& attention_core() = 0;
  virtual RopeChunks& rope_pos0() = 0;
};

struct Block : BlockLayer {
  std::shared_ptr<LayerNorm> ln_1;  // or an RMSNorm (Llama)
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<LayerNorm> ln_2;
  std::shared_ptr<MLP> mlp;  // null when the block has experts:
  std::shared_ptr<MoE> moe;  // (Mixtral's block_sparse_moe) null for a dense block

  // Weights are drawn from gen in registration order: attn.c_attn, attn.c_proj, (mlp.c_gate,) mlp.c_fc, mlp.c_proj
  // (or moe.gate, moe.experts.*, moe.shared_experts).
  Block(int64_t C, int64_t n_head, Generator& gen, double proj_std, double p_dropout = 0.0,
        const BlockOptions& o = {}) {
    ln_1 = register_module("ln_1", make_norm(C, o));
    attn = register_module("attn", std::make_shared<CausalSelfAttention>(C, n_head, gen, proj_std, p_dropout,
                                                                         o.n_kv_head, o.bias, o.rope_base));
    ln_2 = register_module("ln_2", make_norm(C, o));
    if (o.moe.experts > 0)
      moe = register_module("moe", std::make_shared<MoE>(C, o.mlp_hidden, o.moe, gen, proj_std, p_dropout));
    else
      mlp = register_module("mlp", std::make_shared<MLP>(C, gen, proj_std, p_dropout, o.mlp_hidden, o.swiglu, o.bias));
  }

  // x: [B, T, C] -> [B, T, C]
  Tensor forward(const Tensor& x) override {
    using namespace loom::autograd;
    Tensor h = x + attn->forward(ln_1->forward(x));
    const Tensor n = ln_2->forward(h);
    return h + (moe ? moe->forward(n) : mlp->forward(n));
  }
  AttentionCore& attention_core() override { return attn->core; }
  RopeChunks& rope_pos0() override { return attn->rope_pos0; }
};

}  // namespace loom::nn
