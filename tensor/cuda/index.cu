// The indexing ops of ops_index.cpp on the GPU. Each views its tensors as
// [outer, n, inner] around the indexed dim (n: the indexed size, m: the number
// of indices along it):
//   index_select: out[o, j, k] = x[o, idx[j], k]              idx: [m]
//   gather:       out[o, j, k] = x[o, idx[o, j, k], k]        idx: [outer, m, inner]
//   scatter_add:  out[o, t, k] = sum over j with idx[o, j, k] == t of src[o, j, k]
// scatter_add runs one thread per output element, which scans the indices in
// order j = 0, 1, ... and adds the matches: no atomics, the CPU loop's order
// per element, the same bits on every run (O(m) work per output: fine for
// gather's backward over the router's k of E; index_add, whose m can be every
// token's copy, sorts its indices instead: index_add.cu).
#include "tensor/cpu/dispatch.h"
#include "tensor/cuda/cuda_ops.h"
#include "tensor/cuda/launch.cuh"

namespace loom::cuda {
namespace {

DType compute_dtype(DType t) { return t == kFloat64 ? kFloat64 : kFloat32; }

// per_slice_index: idx has one index per j (index_select) rather
// than one per output element (gather, scatter_add).
__global__ void gather_kernel(const char* x, const void* idx, bool idx64, bool per_slice_index, char* out,
                              int64_t outer, int64_t n, int64_t m, int64_t inner, int bytes, IndexOp op,
                              IndexError* error) {
  LOOM_GRID_STRIDE_LOOP(e, outer * m * inner) {
    const int64_t k = e % inner, j = (e / inner) % m, o = e / (inner * m);
    const int64_t t = load_index(idx, idx64, per_slice_index ? j : e);
    if (t >= 0 && t < n) {
      copy_element(out + e * bytes, x + ((o * n + t) * inner + k) * bytes, bytes);
    } else {
      for (int b = 0; b < bytes; ++b) out[e * bytes + b] = 0;
      report_index_error(error, op, t, n);
    }
  }
}

template <class T>
__global__ void scatter_add_kernel(const T* src, const void* idx, bool idx64, bool per_slice_index, T* out,
                                   int64_t outer, int64_t n, int64_t m, int64_t inner, IndexOp op, IndexError* error) {
  LOOM_GRID_STRIDE_LOOP(e, outer * n * inner) {
    const int64_t k = e % inner, t = (e / inner) % n, o = e / (inner * n);
    T acc = 0;
    for (int64_t j = 0; j < m; ++j) {
      const int64_t s = (o * m + j) * inner + k;
      const int64_t target = load_index(idx, idx64, per_slice_index ? j : s);
      if (target == t) acc += src[s];
      else if (t == 0 && (target < 0 || target >= n)) report_index_error(error, op, target, n);
    }
    out[e] = acc;
  }
}

void outer_inner(const Shape& s, int64_t dim, int64_t& outer, int64_t& inner) {
  outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= s[size_t(d)];
  for (size_t d = size_t(dim) + 1; d < s.size(); ++d) inner *= s[d];
}

void check_indices(const char* op, const Tensor& on, const Tensor& idx) {
  LOOM_CHECK(idx.dtype() == kInt64 || idx.dtype() == kInt32, op, ": indices must be int32 or int64, got ",
             idx.describe());
  LOOM_CHECK(on.device() == idx.device(), op, ": devices differ: ", on.device().str(), " and ", idx.device().str());
}

Tensor gather_like(const char* op, IndexOp code, const Tensor& x, int64_t dim, const Tensor& idx, Shape out_shape,
                   bool per_slice_index) {
  check_indices(op, x, idx);
  Tensor xc = ops::contiguous(x), ic = ops::contiguous(idx);
  Tensor out = empty(out_shape, x.dtype(), x.device());
  int64_t outer, inner;
  outer_inner(x.shape(), dim, outer, inner);
  const int64_t n = x.shape()[size_t(dim)], m = out_shape[size_t(dim)];
  if (out.numel() == 0) return out;
  DeviceGuard guard(x.device());
  LaunchConfig c = launch_config(out.numel());
  gather_kernel<<<c.blocks, c.threads, 0, stream(x.device())>>>(
      static_cast<const char*>(xc.raw_data()), ic.raw_data(), ic.dtype() == kInt64, per_slice_index,
      static_cast<char*>(out.raw_data()), outer, n, m, inner, int(element_size(x.dtype())), code,
      index_error_slot(x.device()));
  CUDA_CHECK_LAUNCH();
  return out;
}

// m: indices along dim (idx.numel() for index_add, idx.shape()[dim] for scatter_add)
Tensor scatter_add_like(const char* op, IndexOp code, const Shape& shape, int64_t dim, const Tensor& idx,
                        const Tensor& src, int64_t m, bool per_slice_index) {
  check_indices(op, src, idx);
  LOOM_CHECK(is_floating(src.dtype()), op, ": expected a floating source, got ", src.describe());
  const DType cd = compute_dtype(src.dtype());
  Tensor s = ops::contiguous(ops::to(src, cd)), ic = ops::contiguous(idx);
  Tensor out = empty(shape, cd, src.device());
  int64_t outer, inner;
  outer_inner(shape, dim, outer, inner);
  const int64_t n = shape[size_t(dim)];
  LOOM_CHECK(s.numel() == outer * m * inner, op, ": source ", src.shape(), " does not match ", m, " indices into ",
             shape);
  if (out.numel() > 0) {
    DeviceGuard guard(src.device());
    LaunchConfig c = launch_config(out.numel());
    cudaStream_t st = stream(src.device());
    IndexError* error = index_error_slot(src.device());
    LOOM_DISPATCH_COMPUTE(cd, op, {
      scatter_add_kernel<<<c.blocks, c.threads, 0, st>>>(ptr<scalar_t>(s), ic.raw_data(), ic.dtype() == kInt64,
                                                         per_slice_index, ptr<scalar_t>(out), outer, n, m, inner, code,
                                                         error);
    });
    CUDA_CHECK_LAUNCH();
  }
  return ops::to(out, src.dtype());
}

}  // namespace

// Shapes and dims are checked (and dim wrapped) by the ops in ops_index.cpp.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& idx) {
  Shape out_shape = x.shape();
  out_shape[size_t(dim)] = idx.numel();
  return gather_like("index_select", IndexOp::IndexSelect, x, dim, idx, out_shape, true);
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& idx) {
  return gather_like("gather", IndexOp::Gather, x, dim, idx, idx.shape(), false);
}

Tensor scatter_add(const Shape& shape, int64_t dim, const Tensor& idx, const Tensor& src) {
  return scatter_add_like("scatter_add", IndexOp::ScatterAdd, shape, dim, idx, src, idx.shape()[size_t(dim)], false);
}

}  // namespace loom::cuda
