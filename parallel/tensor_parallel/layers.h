// Megatron-LM's tensor-parallel layers (Shoeybi et al. 2019): one matmul split
// over the tp group, each rank holding 1/tp of the weight. loom's Linear keeps
// PyTorch's layout, weight [out, in], y = x weightᵀ + bias.
//
//   ColumnParallelLinear  weight rows split: rank r holds W[r*out/tp : (r+1)*out/tp, :]
//       x [..., in] --f--> x W_rᵀ + b_r = y_r [..., out/tp]      (gather_output: all-gather -> [..., out])
//   RowParallelLinear     weight columns split: rank r holds W[:, r*in/tp : (r+1)*in/tp]
//       x_r [..., in/tp] -> x_r W_rᵀ (a partial sum) --g--> sum_r + b = y [..., out]
//   VocabParallelEmbedding  the rows of the table split: rank r holds ids [r*V/tp, (r+1)*V/tp);
//       ids outside look up zeros, and g sums the one rank that had each id.
//
// Column then row (the MLP's fc1 -> GELU -> fc2, attention's qkv -> heads ->
// proj) needs no communication in between: one f before, one g after, i.e.
// Megatron's two all-reduces per block in forward and two in backward.
// With sequence parallelism f becomes an all-gather along T and g a
// reduce-scatter along T (mappings.h): the same bytes, but layernorm and
// dropout between blocks then run on T/tp of the tokens.
//
// Every shard is cut from the full layer's initialisation (from_full), so tp
// = N starts from exactly the weights of tp = 1.
#pragma once

#include "nn/module.h"
#include "parallel/comm/process_group.h"

namespace loom::parallel {

struct ColumnParallelLinear : nn::Layer {
  Tensor weight;  // [out / tp, in]
  Tensor bias;    // [out / tp], or undefined
  ProcessGroup& tp;
  bool gather_output, sequence_parallel;

  // full_weight [out, in], full_bias [out] (may be undefined): this rank keeps its rows.
  ColumnParallelLinear(const Tensor& full_weight, const Tensor& full_bias, ProcessGroup& tp,
                       bool gather_output = false, bool sequence_parallel = false);
  // x: [B, T, in] ([B, T/tp, in] under sequence parallelism) -> [B, T, out/tp] (or [B, T, out] gathered)
  Tensor forward(const Tensor& x) override;
  // gelu(forward(x)), the GELU fused into the GEMM (autograd::linear_gelu): the MLP's c_fc.
  Tensor forward_gelu(const Tensor& x);
};

struct RowParallelLinear : nn::Layer {
  Tensor weight;  // [out, in / tp]
  Tensor bias;    // [out], replicated on every tp rank (added once, after the sum)
  ProcessGroup& tp;
  bool sequence_parallel;

  RowParallelLinear(const Tensor& full_weight, const Tensor& full_bias, ProcessGroup& tp,
                    bool sequence_parallel = false);
  // x: [B, T, in/tp] -> [B, T, out] ([B, T/tp, out] under sequence parallelism)
  Tensor forward(const Tensor& x) override;
};

struct VocabParallelEmbedding : nn::Layer {
  Tensor weight;  // [V / tp, C]: ids [vocab_start, vocab_start + V/tp)
  int64_t vocab_start = 0;
  ProcessGroup& tp;

  VocabParallelEmbedding(const Tensor& full_weight, ProcessGroup& tp);
  // ids: int [...] -> [..., C], the full embedding on every rank
  Tensor forward(const Tensor& ids) override;
};

// The rows [r * n / tp, (r+1) * n / tp) of a full tensor along dim, for rank r
// of tp: how every shard is cut. Error if n does not divide, naming the numbers.
Tensor shard_of(const Tensor& full, int64_t dim, ProcessGroup& tp, const char* what);

}  // namespace loom::parallel
