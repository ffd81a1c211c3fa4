// Indexing and joining: index_select / index_add, gather / scatter_add, cat,
// split and stack. Index ops view x as [outer, n, inner] around the indexed dim.
// On a GPU the index ops run cuda/index.cu's kernels (index_add: cuda/index_add.cu); cat/split/stack
// are views and copies.
#include <algorithm>
#include <cstring>

#include "tensor/cpu/dispatch.h"
#include "tensor/cuda/cuda_ops.h"
#include "tensor/kernels/segment_sum.h"
#include "tensor/ops.h"

namespace loom::ops {

namespace {

int64_t wrap(const char* op, int64_t d, int64_t ndim) {
  LOOM_CHECK(d >= -ndim && d < ndim, op, ": dim ", d, " out of range for a ", ndim, "-d tensor");
  return d < 0 ? d + ndim : d;
}

std::vector<int64_t> read_indices(const char* op, const Tensor& idx, int64_t limit) {
  LOOM_CHECK(idx.dtype() == kInt64 || idx.dtype() == kInt32, op, ": indices must be int32 or int64, got ",
             idx.describe());
  std::vector<int64_t> v = idx.to_vector<int64_t>();
  for (int64_t i : v) LOOM_CHECK(i >= 0 && i < limit, op, ": index ", i, " out of range for size ", limit);
  return v;
}

// outer = prod(shape[:dim]), inner = prod(shape[dim+1:])
void outer_inner(const Shape& s, int64_t dim, int64_t& outer, int64_t& inner) {
  outer = 1; inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= s[size_t(d)];
  for (size_t d = size_t(dim) + 1; d < s.size(); ++d) inner *= s[d];
}

}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& idx) {
  dim = wrap("index_select", dim, x.dim());
  LOOM_CHECK(idx.dim() == 1, "index_select: indices must be 1-D, got ", idx.shape());
  if (x.device().is_cuda() || idx.device().is_cuda()) return cuda::index_select(x, dim, idx);
  int64_t n = x.shape()[size_t(dim)];
  std::vector<int64_t> ids = read_indices("index_select", idx, n);
  Tensor xc = contiguous(x);
  Shape out_shape = x.shape();
  out_shape[size_t(dim)] = int64_t(ids.size());
  Tensor out = empty(out_shape, x.dtype());
  int64_t outer, inner;
  outer_inner(x.shape(), dim, outer, inner);
  size_t es = element_size(x.dtype()), row = size_t(inner) * es;
  const char* src = static_cast<const char*>(xc.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  int64_t m = int64_t(ids.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < m; ++j)
      std::memcpy(dst + size_t(o * m + j) * row, src + size_t(o * n + ids[size_t(j)]) * row, row);
  return out;
}

Tensor index_add(const Tensor& like, int64_t dim, const Tensor& idx, const Tensor& src) {
  // zeros(like.shape) with src's slices added at idx along dim.
  dim = wrap("index_add", dim, like.dim());
  if (src.device().is_cuda() || idx.device().is_cuda()) return cuda::index_add(like, dim, idx, src);
  int64_t n = like.shape()[size_t(dim)];
  std::vector<int64_t> ids = read_indices("index_add", idx, n);
  DType cd = src.dtype() == kFloat64 ? kFloat64 : kFloat32;
  Tensor out = empty(like.shape(), cd), s = contiguous(to(src, cd));
  int64_t outer, inner, m = int64_t(ids.size());
  outer_inner(like.shape(), dim, outer, inner);
  LOOM_CHECK(s.numel() == outer * m * inner, "index_add: source ", src.shape(), " does not match ", m, " indices into ",
             like.shape());
  // The indices sorted stably by target (a counting sort): target t's slices are
  // order[offsets[t] .. offsets[t+1]), ascending, as cuda/index_add.cu sorts them.
  std::vector<int64_t> offsets(static_cast<size_t>(n) + 1, 0), order(static_cast<size_t>(m));
  for (int64_t t : ids) ++offsets[size_t(t) + 1];
  for (size_t t = 0; t < size_t(n); ++t) offsets[t + 1] += offsets[t];
  std::vector<int64_t> next(offsets.begin(), offsets.end() - 1);
  for (int64_t j = 0; j < m; ++j) order[size_t(next[size_t(ids[size_t(j)])]++)] = j;
  LOOM_DISPATCH_COMPUTE(cd, "index_add", {
    const scalar_t* sp = s.data<scalar_t>();
    scalar_t* op = out.data<scalar_t>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t t = 0; t < n; ++t)
        for (int64_t k = 0; k < inner; ++k)
          op[(o * n + t) * inner + k] = kernels::segment_sum(sp + o * m * inner, order.data(), offsets[size_t(t)],
                                                             offsets[size_t(t) + 1], inner, k);
  });
  return to(out, src.dtype());
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& idx) {
  dim = wrap("gather", dim, x.dim());
  LOOM_CHECK(idx.dim() == x.dim(), "gather: indices ", idx.shape(), " must have the rank of input ", x.shape());
  for (int64_t d = 0; d < x.dim(); ++d)
    LOOM_CHECK(d == dim || idx.shape()[size_t(d)] == x.shape()[size_t(d)], "gather: indices ", idx.shape(),
               " must match input ", x.shape(), " except in dim ", dim);
  if (x.device().is_cuda() || idx.device().is_cuda()) return cuda::gather(x, dim, idx);
  int64_t n = x.shape()[size_t(dim)], m = idx.shape()[size_t(dim)];
  std::vector<int64_t> ids = read_indices("gather", idx, n);
  Tensor xc = contiguous(x), out = empty(idx.shape(), x.dtype());
  int64_t outer, inner;
  outer_inner(x.shape(), dim, outer, inner);
  size_t es = element_size(x.dtype());
  const char* src = static_cast<const char*>(xc.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < m; ++j)
      for (int64_t k = 0; k < inner; ++k) {
        int64_t oi = (o * m + j) * inner + k;
        std::memcpy(dst + size_t(oi) * es, src + size_t((o * n + ids[size_t(oi)]) * inner + k) * es, es);
      }
  return out;
}

Tensor scatter_add(const Shape& shape, int64_t dim, const Tensor& idx, const Tensor& src) {
  dim = wrap("scatter_add", dim, int64_t(shape.size()));
  LOOM_CHECK(idx.shape() == src.shape(), "scatter_add: indices ", idx.shape(), " and source ", src.shape(), " differ");
  if (src.device().is_cuda() || idx.device().is_cuda()) return cuda::scatter_add(shape, dim, idx, src);
  int64_t n = shape[size_t(dim)], m = idx.shape()[size_t(dim)];
  std::vector<int64_t> ids = read_indices("scatter_add", idx, n);
  DType cd = src.dtype() == kFloat64 ? kFloat64 : kFloat32;
  Tensor out = zeros(shape, cd), s = contiguous(to(src, cd));
  int64_t outer, inner;
  outer_inner(shape, dim, outer, inner);
  LOOM_DISPATCH_COMPUTE(cd, "scatter_add", {
    const scalar_t* sp = s.data<scalar_t>();
    scalar_t* op = out.data<scalar_t>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < m; ++j)
        for (int64_t k = 0; k < inner; ++k) {
          int64_t si = (o * m + j) * inner + k;
          op[(o * n + ids[size_t(si)]) * inner + k] += sp[si];
        }
  });
  return to(out, src.dtype());
}

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  LOOM_CHECK(!xs.empty(), "cat: no tensors given");
  const Tensor& first = xs[0];
  dim = wrap("cat", dim, first.dim());
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    LOOM_CHECK(x.dim() == first.dim() && x.dtype() == first.dtype(), "cat: tensor ", i, " is ", x.describe(),
               ", tensor 0 is ", first.describe());
    LOOM_CHECK(x.device() == first.device(), "cat: tensor ", i, " is on ", x.device().str(), ", tensor 0 on ",
               first.device().str());
    for (int64_t d = 0; d < x.dim(); ++d)
      LOOM_CHECK(d == dim || x.shape()[size_t(d)] == first.shape()[size_t(d)], "cat: tensor ", i, " has shape ",
                 x.shape(), ", tensor 0 has ", first.shape(), " (must match except in dim ", dim, ")");
    total += x.shape()[size_t(dim)];
  }
  Shape out_shape = first.shape();
  out_shape[size_t(dim)] = total;
  Tensor out = empty(out_shape, first.dtype(), first.device());
  int64_t at = 0;
  for (const Tensor& x : xs) {
    copy_(narrow(out, dim, at, x.shape()[size_t(dim)]), x);
    at += x.shape()[size_t(dim)];
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  dim = wrap("split", dim, x.dim());
  LOOM_CHECK(split_size > 0, "split: split_size must be positive, got ", split_size);
  std::vector<Tensor> parts;
  int64_t n = x.shape()[size_t(dim)];
  for (int64_t s = 0; s < n; s += split_size) parts.push_back(narrow(x, dim, s, std::min(split_size, n - s)));
  return parts;
}

Tensor stack(const std::vector<Tensor>& xs, int64_t dim) {
  LOOM_CHECK(!xs.empty(), "stack: no tensors given");
  std::vector<Tensor> us;
  for (size_t i = 0; i < xs.size(); ++i) {
    LOOM_CHECK(xs[i].shape() == xs[0].shape(), "stack: tensor ", i, " has shape ", xs[i].shape(), ", tensor 0 has ",
               xs[0].shape());
    us.push_back(unsqueeze(xs[i], dim));
  }
  return cat(us, dim);
}

}  // namespace loom::ops
