#include "parallel/tensor_parallel/mappings.h"

#include "autograd/function.h"
#include "tensor/ops.h"

namespace loom::parallel {

namespace {

int64_t wrap(int64_t dim, const Tensor& x) { return dim < 0 ? dim + x.dim() : dim; }

// x with `dim` moved to the front, contiguous: the layout in which a flat
// collective's rank blocks are blocks of that dim.
Tensor dim_first(const Tensor& x, int64_t dim) {
  return ops::contiguous(dim == 0 ? x : ops::transpose(x, 0, dim));
}
Tensor dim_back(const Tensor& x, int64_t dim) { return dim == 0 ? x : ops::contiguous(ops::transpose(x, 0, dim)); }

}  // namespace

Tensor all_gather_along(const Tensor& x, int64_t dim, ProcessGroup& group) {
  dim = wrap(dim, x);
  if (group.size() == 1) return x;
  Tensor in = dim_first(x, dim);  // [n, ...]
  Shape out_shape = in.shape();
  out_shape[0] *= group.size();  // [size * n, ...]: rank r's block at r
  Tensor out = empty(out_shape, x.dtype());
  group.all_gather(out, in);
  return dim_back(out, dim);
}

Tensor reduce_scatter_along(const Tensor& x, int64_t dim, ProcessGroup& group) {
  dim = wrap(dim, x);
  if (group.size() == 1) return x;
  LOOM_CHECK(x.size(dim) % group.size() == 0, "reduce_scatter_along: dim ", dim, " of ", x.shape(),
             " does not split over ", group.size(), " ranks of group ", group.name());
  Tensor in = dim_first(x, dim);
  Shape out_shape = in.shape();
  out_shape[0] /= group.size();
  Tensor out = empty(out_shape, x.dtype());
  group.reduce_scatter(out, in, ReduceOp::Sum);
  return dim_back(out, dim);
}

Tensor slice_along(const Tensor& x, int64_t dim, ProcessGroup& group) {
  dim = wrap(dim, x);
  LOOM_CHECK(x.size(dim) % group.size() == 0, "slice_along: dim ", dim, " of ", x.shape(), " does not split over ",
             group.size(), " ranks of group ", group.name());
  const int64_t n = x.size(dim) / group.size();
  return ops::contiguous(ops::narrow(x, dim, group.rank() * n, n));
}

// ---- tensor-parallel regions ----------------------------------------------------------

Tensor copy_to_tp_region(const Tensor& x, ProcessGroup& tp) {
  return autograd::record("CopyToTensorParallelRegion", {&x}, x, [&tp](const autograd::TensorList& g) {
    Tensor sum = ops::clone(g[0]);
    tp.all_reduce(sum, ReduceOp::Sum);
    return autograd::TensorList{sum};
  });
}

Tensor reduce_from_tp_region(const Tensor& x, ProcessGroup& tp) {
  Tensor sum = ops::clone(x);
  tp.all_reduce(sum, ReduceOp::Sum);
  return autograd::record("ReduceFromTensorParallelRegion", {&x}, sum,
                          [](const autograd::TensorList& g) { return autograd::TensorList{g[0]}; });
}

Tensor gather_from_tp_region(const Tensor& x, ProcessGroup& tp) {
  return autograd::record("GatherFromTensorParallelRegion", {&x}, all_gather_along(x, -1, tp),
                          [&tp](const autograd::TensorList& g) {
                            return autograd::TensorList{slice_along(g[0], -1, tp)};
                          });
}

// ---- sequence-parallel regions (dim 1 = T) --------------------------------------------

Tensor gather_from_sp_region(const Tensor& x, ProcessGroup& tp) {
  return autograd::record("GatherFromSequenceParallelRegion", {&x}, all_gather_along(x, 1, tp),
                          [&tp](const autograd::TensorList& g) {
                            return autograd::TensorList{reduce_scatter_along(g[0], 1, tp)};
                          });
}

Tensor reduce_scatter_to_sp_region(const Tensor& x, ProcessGroup& tp) {
  return autograd::record("ReduceScatterToSequenceParallelRegion", {&x}, reduce_scatter_along(x, 1, tp),
                          [&tp](const autograd::TensorList& g) {
                            return autograd::TensorList{all_gather_along(g[0], 1, tp)};
                          });
}

Tensor scatter_to_sp_region(const Tensor& x, ProcessGroup& tp) {
  return autograd::record("ScatterToSequenceParallelRegion", {&x}, slice_along(x, 1, tp),
                          [&tp](const autograd::TensorList& g) {
                            return autograd::TensorList{all_gather_along(g[0], 1, tp)};
                          });
}

}  // namespace loom::parallel
