#include "parallel/tensor_parallel/layers.h"

#include "autograd/functions.h"
#include "parallel/tensor_parallel/mappings.h"
#include "tensor/ops.h"

namespace loom::parallel {

Tensor shard_of(const Tensor& full, int64_t dim, ProcessGroup& tp, const char* what) {
  LOOM_CHECK(full.size(dim) % tp.size() == 0, what, ": dim ", dim, " of ", full.shape(), " (", full.size(dim),
             ") does not split over tp = ", tp.size(), " ranks");
  return ops::clone(slice_along(full, dim, tp));  // its own storage: the shard is a new parameter
}

ColumnParallelLinear::ColumnParallelLinear(const Tensor& full_weight, const Tensor& full_bias, ProcessGroup& tp_group,
                                           bool gather, bool sp)
    : tp(tp_group), gather_output(gather), sequence_parallel(sp) {
  weight = register_parameter("weight", shard_of(full_weight, 0, tp, "ColumnParallelLinear weight"));
  if (full_bias.defined()) bias = register_parameter("bias", shard_of(full_bias, 0, tp, "ColumnParallelLinear bias"));
}

Tensor ColumnParallelLinear::forward(const Tensor& x) {
  // f: every rank needs all of x (all of T under sequence parallelism).
  Tensor x_all = sequence_parallel ? gather_from_sp_region(x, tp) : copy_to_tp_region(x, tp);
  Tensor y = autograd::linear(x_all, weight, bias);  // [B, T, out/tp]
  return gather_output ? gather_from_tp_region(y, tp) : y;
}

// GELU is elementwise: this rank's columns of gelu(x Wᵀ + b) are gelu of its own columns.
Tensor ColumnParallelLinear::forward_gelu(const Tensor& x) {
  Tensor x_all = sequence_parallel ? gather_from_sp_region(x, tp) : copy_to_tp_region(x, tp);
  Tensor y = autograd::linear_gelu(x_all, weight, bias);  // [B, T, out/tp]
  return gather_output ? gather_from_tp_region(y, tp) : y;
}

RowParallelLinear::RowParallelLinear(const Tensor& full_weight, const Tensor& full_bias, ProcessGroup& tp_group,
                                     bool sp)
    : tp(tp_group), sequence_parallel(sp) {
  weight = register_parameter("weight", shard_of(full_weight, 1, tp, "RowParallelLinear weight"));
  if (full_bias.defined()) bias = register_parameter("bias", ops::clone(full_bias));
}

Tensor RowParallelLinear::forward(const Tensor& x) {
  Tensor partial = autograd::linear(x, weight, Tensor());  // this rank's share of the sum: [B, T, out]
  // g: sum the shares (scattered along T under sequence parallelism), then the bias once.
  Tensor y = sequence_parallel ? reduce_scatter_to_sp_region(partial, tp) : reduce_from_tp_region(partial, tp);
  return bias.defined() ? autograd::add(y, bias) : y;
}

VocabParallelEmbedding::VocabParallelEmbedding(const Tensor& full_weight, ProcessGroup& tp_group) : tp(tp_group) {
  weight = register_parameter("weight", shard_of(full_weight, 0, tp, "VocabParallelEmbedding weight"));
  vocab_start = tp.rank() * weight.size(0);
}

Tensor VocabParallelEmbedding::forward(const Tensor& ids) {
  // Ids outside [vocab_start, vocab_start + n) belong to another rank: look up
  // row 0 for them and zero the result, so only the owner contributes to g's sum.
  const int64_t n = weight.size(0);
  Tensor id = ops::contiguous(ops::to(ids, kInt64));
  Tensor local = empty(id.shape(), kInt64), outside = empty(id.shape(), kFloat32);
  const int64_t* v = id.data<int64_t>();
  int64_t* l = local.data<int64_t>();
  float* o = outside.data<float>();
  for (int64_t i = 0; i < id.numel(); ++i) {
    const int64_t r = v[i] - vocab_start;
    o[i] = r < 0 || r >= n ? 1.0f : 0.0f;
    l[i] = o[i] != 0 ? 0 : r;
  }
  Tensor rows = autograd::embedding(weight, local);                                // [..., C]
  Tensor owned = autograd::masked_fill(rows, ops::unsqueeze(outside, -1), 0.0);  // zero where not ours
  return reduce_from_tp_region(owned, tp);
}

}  // namespace loom::parallel
