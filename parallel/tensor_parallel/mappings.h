// The communication of tensor parallelism as autograd functions
// (Megatron-LM's core/tensor_parallel/mappings.py). Each one is a collective in forward and its
// conjugate in backward, so a layer split over the tp group stays one
// differentiable function:
//
//   f  copy_to_tp_region        forward: identity       backward: all-reduce (sum)
//   g  reduce_from_tp_region    forward: all-reduce     backward: identity
//      gather_from_tp_region    forward: all-gather     backward: keep this rank's slice
//                               (along the last dim: ColumnParallelLinear's gather_output)
//   sequence parallelism (Megatron-SP, Korthikanti et al. 2022), along dim 1 (T of [B, T, C]):
//      gather_from_sp_region    forward: all-gather     backward: reduce-scatter
//      reduce_scatter_to_sp_region  forward: reduce-scatter  backward: all-gather
//      scatter_to_sp_region     forward: keep this rank's slice  backward: all-gather
//
// Why f's backward is an all-reduce: X feeds every rank's column shard
// (Y_r = X A_r), so dL/dX = sum_r dL/dY_r A_rᵀ, one partial sum per rank.
// Why g's forward is one: the row shards each compute a partial product
// (Y = sum_r X_r A_r). f and g are each other's transpose (Megatron's paper, §3).
#pragma once

#include "parallel/comm/process_group.h"
#include "tensor/tensor.h"

namespace loom::parallel {

Tensor copy_to_tp_region(const Tensor& x, ProcessGroup& tp);
Tensor reduce_from_tp_region(const Tensor& x, ProcessGroup& tp);
Tensor gather_from_tp_region(const Tensor& x, ProcessGroup& tp);  // [..., c] -> [..., tp * c]

Tensor gather_from_sp_region(const Tensor& x, ProcessGroup& tp);        // [B, t, C] -> [B, tp * t, C]
Tensor reduce_scatter_to_sp_region(const Tensor& x, ProcessGroup& tp);  // [B, T, C] -> [B, T / tp, C]
Tensor scatter_to_sp_region(const Tensor& x, ProcessGroup& tp);         // [B, T, C] -> [B, T / tp, C]

// The raw collectives along one dim, without autograd (the pieces of the above).
Tensor all_gather_along(const Tensor& x, int64_t dim, ProcessGroup& group);      // size(dim) * group.size()
Tensor reduce_scatter_along(const Tensor& x, int64_t dim, ProcessGroup& group);  // size(dim) / group.size()
Tensor slice_along(const Tensor& x, int64_t dim, ProcessGroup& group);           // this rank's block of dim

}  // namespace loom::parallel
