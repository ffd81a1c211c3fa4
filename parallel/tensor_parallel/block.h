// A transformer block split over the tp group (Megatron-LM's ParallelTransformerLayer),
// cut from a full nn::Block so tp = N starts from tp = 1's weights:
//
//   ln_1, ln_2         replicated (every rank holds all C)
//   attn.c_attn        column-parallel by heads: rank r holds the q, k and v rows of
//                      heads [r H/tp, (r+1) H/tp)  -> q, k, v [B, T, C/tp] each
//   attention itself   local: H/tp heads, no communication (heads are independent)
//   attn.c_proj        row-parallel: its input columns are those heads' outputs
//   mlp.c_fc, c_proj   column-parallel, then row-parallel
//   moe (experts)      the router and the routed experts whole on every tp rank
//                      (Megatron with expert-tensor-parallel 1); the shared
//                      experts cut as the MLP is (column w1/w3, row w2); see below
//
// Forward per block: one f and one g per sub-layer (Megatron's 2 all-reduces
// in forward, 2 in backward). With sequence_parallel the residual stream and
// the layernorms hold [B, T/tp, C]: f becomes an all-gather along T and g a
// reduce-scatter; then each rank's layernorm weights see only T/tp tokens, and
// their gradients must be summed over tp after backward (replicated_grads()).
// Parameter names are the full block's (ln_1.weight, attn.c_attn.weight, ...),
// so a tp checkpoint names the same tensors as a tp = 1 one.
// The Llama options cut the same way: grouped-query attention splits the q
// heads and the kv heads over tp (each rank keeps the kv heads its q heads
// read: both counts must divide by tp), RoPE rotates each rank's own heads,
// SwiGLU's gate is column-parallel like c_fc (up), RMSNorm is replicated.
// A mixture of experts (nn/moe.h) takes the MLP's place with no communication
// of its own but the shared experts': it routes and computes the tokens this
// rank holds and adds its output to this rank's residual stream. Without
// sequence parallelism that is every token, on every tp rank alike (the same
// output and the same gradients on each: the router and experts are replicated
// params like the layernorms, never reduced - reducing the routed output over
// tp would count it tp times). With it, each tp rank holds T/tp tokens and
// computes their experts alone (no all-gather first, no reduce after); the
// router's and experts' gradients are then partial sums over tp, summed after
// backward with the layernorms' (finalize_model_grads.h), and the aux loss's
// f_e and the loads are summed over tp (parallel/moe_token_shards.h).
// Dropout is not supported here yet (p must be 0): matching tp = 1's masks
// needs a generator keyed by element position (Megatron's RNG tracker).
#pragma once

#include <memory>

#include "nn/block.h"
#include "parallel/tensor_parallel/layers.h"

namespace loom::parallel {

struct TensorParallelAttention : nn::Module {
  std::shared_ptr<ColumnParallelLinear> c_attn;  // [(H + 2 Hkv) hd / tp, C]: this rank's heads' q, k, v rows
  std::shared_ptr<RowParallelLinear> c_proj;     // [C, C/tp]
  int64_t local_heads, local_kv_heads, head_dim;
  double rope_base;                              // 0: no rotary embeddings
  nn::RopeChunks rope_pos0;                      // where T's equal chunks start (nn::rope_chunks)
  nn::AttentionCore core = nn::attend;  // this rank's heads (nn/attention.h: the seam)

  TensorParallelAttention(const nn::CausalSelfAttention& full, ProcessGroup& tp, bool sequence_parallel);
  // x: [B, T, C] ([B, T/tp, C] under sequence parallelism) -> the same shape
  Tensor forward(const Tensor& x);
};

struct TensorParallelMLP : nn::Layer {
  std::shared_ptr<ColumnParallelLinear> c_gate;  // [F/tp, C], SwiGLU only
  std::shared_ptr<ColumnParallelLinear> c_fc;  // [4C/tp, C] (F/tp)
  std::shared_ptr<RowParallelLinear> c_proj;   // [C, 4C/tp]

  TensorParallelMLP(const nn::MLP& full, ProcessGroup& tp, bool sequence_parallel);
  Tensor forward(const Tensor& x) override;
};

struct TensorParallelBlock : nn::BlockLayer {
  std::shared_ptr<nn::LayerNorm> ln_1, ln_2;
  std::shared_ptr<TensorParallelAttention> attn;
  std::shared_ptr<TensorParallelMLP> mlp;  // null when the block has experts:
  std::shared_ptr<nn::MoE> moe;            // routed experts whole, shared experts a TensorParallelMLP

  TensorParallelBlock(const nn::Block& full, ProcessGroup& tp, bool sequence_parallel = false);
  Tensor forward(const Tensor& x) override;
  nn::AttentionCore& attention_core() override { return attn->core; }
  nn::RopeChunks& rope_pos0() override { return attn->rope_pos0; }

  // The params every tp rank holds whole (layernorms, row-parallel biases, router, routed experts):
  // counted once in the grad norm; under sequence parallelism their gradients
  // are partial sums (each rank saw T/tp tokens) to be all-reduced over tp.
  std::vector<Tensor> replicated_params() const;
};

// c_attn's weight [3C, C] (rows q | k | v) reordered so that a contiguous 1/tp
// of its rows is one rank's heads: [q_0 k_0 v_0 | q_1 k_1 v_1 | ...] where q_r
// are the rows of heads [r H/tp, (r+1) H/tp). The same for the bias [3C].
// kv_rows: the rows of k (and of v) when they are fewer than q's (grouped-query
// attention: [C + 2 kv_rows, C]); 0 means C.
Tensor qkv_rows_by_rank(const Tensor& w, int tp_size, int64_t kv_rows = 0);

}  // namespace loom::parallel
