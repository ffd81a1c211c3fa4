// Where each element of a tensor-parallel shard lives in the full tensor, so
// that a tp run can save the same full-model checkpoint as tp = 1 (gather on
// save) and resume from any checkpoint at any tp (cut on load).
//
// The cut is not one formula: ColumnParallelLinear keeps rows, RowParallelLinear
// columns, attention's c_attn rows regrouped by head (q_r k_r v_r per rank),
// the vocab-parallel wte rows of a table padded to a multiple of tp. Rather
// than a second copy of those rules, the map is *measured*: the full layers
// are built with every parameter holding its own flat index (1, 2, 3, ...),
// cut by the very code that cuts the real weights (gpt.h), and each shard
// then reads off where its elements came from:
//
//   full c_proj.weight [C, C] = [[1 2 3 4] [5 6 7 8] ...]   (index + 1)
//   rank 1 of tp 2 keeps columns 2..3:  [[3 4] [7 8] ...]  -> index [2 3 6 7 ...]
//
// A padded vocabulary row reads 0 (padded_table's zeros): index = full numel,
// a slot past the end that gather drops and cut fills with 0.
#pragma once

#include <map>
#include <string>

#include "nn/gpt.h"
#include "parallel/comm/process_group.h"

namespace loom::parallel {

struct ShardMap {
  Shape full_shape;   // the unsplit parameter's shape, as in nn::GPT
  Tensor index;       // int64 [shard numel]: flat index into the full tensor (full numel: padding)
  bool replicated;    // every tp rank holds all of it (layernorms, row-parallel biases, wpe)
};
using ShardMaps = std::map<std::string, ShardMap>;  // by the full model's parameter name

// The maps of full layers [begin, begin + full.size()) of cfg's GPT cut over
// tp (as cut_gpt_layers_for_tp cuts them). Overwrites full's weights with
// their indices: pass layers whose real weights were already cut (so the
// model is initialised once). Names as ModelChunks registers them:
// "wte.weight", "blocks.3.attn.c_attn.weight", ...
ShardMaps tensor_parallel_shard_maps(const std::vector<std::shared_ptr<nn::Layer>>& full, const nn::GPTConfig& cfg,
                                     int64_t begin, ProcessGroup& tp, bool sequence_parallel);

// The full tensor [full_shape] from every tp rank's shard: each rank places its
// elements, and a sum over tp joins them (a replicated param is placed by tp
// rank 0 alone). Exact in any dtype: every element is one value plus zeros.
// Collective over tp; the result is on every rank, in shard's dtype.
Tensor gather_full(const Tensor& shard, const ShardMap& map, ProcessGroup& tp);

// This rank's shard of a full tensor (any shape with full_shape's numel):
// index_select by the map, zeros on padding. No communication.
Tensor cut_shard(const Tensor& full, const ShardMap& map);

// A stage's parameters under tp, from its maps (--memory-report's formula line):
// per rank = (split + vocabulary padding) / tp + replicated.
struct TensorParallelParamCount {
  int64_t split = 0;       // elements of the full tensors that are split over tp
  int64_t padding = 0;     // zero rows added to the vocabulary (gpt.h), all ranks together
  int64_t replicated = 0;  // elements every tp rank holds whole
  int tp = 1;
  int64_t per_rank() const { return (split + padding) / tp + replicated; }
};
TensorParallelParamCount count_params(const ShardMaps& maps, int tp_size);

}  // namespace loom::parallel
