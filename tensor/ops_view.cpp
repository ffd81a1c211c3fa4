// Copies, dtype conversion and views: the ops that move or re-describe data
// without doing math on it.
#include <algorithm>
#include <cstring>

#include "tensor/profile.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/loops.h"
#include "tensor/cuda/cuda_ops.h"
#include "tensor/ops.h"

namespace loom::ops {

static int64_t wrap(const char* op, int64_t d, int64_t ndim) {
  LOOM_CHECK(d >= -ndim && d < ndim, op, ": dim ", d, " out of range for a ", ndim, "-d tensor");
  return d < 0 ? d + ndim : d;
}

static Tensor make_view(const Tensor& x, Shape shape, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = x.storage();
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = x.dtype();
  return Tensor(std::move(impl));
}

void copy_(const Tensor& dst, const Tensor& src) {
  // "copy", or "convert" between dtypes (bf16 <-> fp32 widening and rounding)
  profile::Scope prof(dst.dtype() == src.dtype() ? "copy" : "convert", 0,
                      double(dst.numel()) * double(element_size(dst.dtype()) + element_size(src.dtype())));
  dst.check_inplace("copy_");
  broadcast_shapes("copy_", dst.shape(), src.shape());
  LOOM_CHECK(numel_of(broadcast_shapes("copy_", dst.shape(), src.shape())) == dst.numel(), "copy_: source ",
             src.shape(), " does not broadcast to destination ", dst.shape());
  if (dst.device().is_cuda() || src.device().is_cuda()) return cuda::copy_(dst, src);  // also across devices
  check_device_supported("copy_", dst.device());
  check_device_supported("copy_", src.device());
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous() && dst.shape() == src.shape()) {
    if (dst.raw_data() != src.raw_data()) std::memmove(dst.raw_data(), src.raw_data(), dst.nbytes());
    return;
  }
  LOOM_DISPATCH_ALL(dst.dtype(), "copy_", {
    using D = scalar_t;
    LOOM_DISPATCH_ALL(src.dtype(), "copy_", {
      using S = scalar_t;
      if constexpr (std::is_same_v<D, S>) {
        cpu::unary_loop<D, S>(dst, src, [](S v) { return v; });
      } else {
        cpu::unary_loop<D, S>(dst, src, [](S v) { return cpu::from_acc<D>(cpu::to_acc(v)); });
      }
    });
  });
}

Tensor to(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Tensor out = empty(x.shape(), dtype, x.device());
  copy_(out, x);
  return out;
}

Tensor to(const Tensor& x, const Device& device) { return to(x, device, x.dtype()); }

Tensor to(const Tensor& x, const Device& device, DType dtype) {
  if (x.device() == device) return to(x, dtype);
  Tensor out = empty(x.shape(), dtype, device);
  copy_(out, x);
  return out;
}

Tensor contiguous(const Tensor& x) {
  if (x.is_contiguous()) return x;
  return clone(x);
}

void set_data(const Tensor& t, const Tensor& src) {
  LOOM_CHECK(t.defined() && src.defined(), "set_data: both tensors must be defined");
  TensorImpl& dst = *t.impl();
  const TensorImpl& from = *src.impl();
  dst.storage = from.storage;
  dst.shape = from.shape;
  dst.strides = from.strides;
  dst.offset = from.offset;
  dst.dtype = from.dtype;
}

Tensor clone(const Tensor& x) {
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  copy_(out, x);
  return out;
}

void fill_(const Tensor& t, double value) {
  t.check_inplace("fill_");
  if (t.device().is_cuda()) return cuda::fill_(t, value);
  LOOM_DISPATCH_ALL(t.dtype(), "fill_", {
    scalar_t v = cpu::from_acc<scalar_t>(value);
    cpu::unary_loop<scalar_t, scalar_t>(t, t, [v](scalar_t) { return v; });
  });
}

void zero_(const Tensor& t) {
  t.check_inplace("zero_");
  if (t.device().is_cuda()) return cuda::zero_(t);
  if (t.is_contiguous()) std::memset(t.raw_data(), 0, t.nbytes());
  else fill_(t, 0.0);
}

// ---- views ---------------------------------------------------------------------

static Shape infer_shape(const char* op, const Tensor& x, Shape shape) {
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      LOOM_CHECK(infer < 0, op, ": only one dimension can be -1 in ", shape);
      infer = int64_t(i);
    } else {
      LOOM_CHECK(shape[i] >= 0, op, ": negative size in ", shape);
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    LOOM_CHECK(known != 0 && x.numel() % known == 0, op, ": cannot view ", x.shape(), " (", x.numel(),
               " elements) as ", shape);
    shape[size_t(infer)] = x.numel() / known;
  }
  LOOM_CHECK(numel_of(shape) == x.numel(), op, ": cannot view ", x.shape(), " (", x.numel(), " elements) as ",
             shape, " (", numel_of(shape), " elements)");
  return shape;
}

// Strides for viewing x as `shape` without copying, or empty if impossible
// (the same rule as PyTorch's computeStride: each group of old dims that is
// contiguous in memory can be re-split freely).
static bool view_strides(const Tensor& x, const Shape& shape, Shape& out) {
  out.assign(shape.size(), 0);
  if (x.numel() == 0) { out = contiguous_strides(shape); return true; }
  if (x.dim() == 0) { out.assign(shape.size(), 1); return true; }  // a scalar viewed as [1, 1, ...]
  const Shape& os = x.shape();
  const Shape& ost = x.strides();
  int64_t view_d = int64_t(shape.size()) - 1;
  int64_t chunk_base_stride = ost.empty() ? 1 : ost.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = int64_t(os.size()) - 1; d >= 0; --d) {
    tensor_numel *= os[size_t(d)];
    if (d == 0 || (os[size_t(d - 1)] != 1 && ost[size_t(d - 1)] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[size_t(view_d)] == 1)) {
        out[size_t(view_d)] = view_numel * chunk_base_stride;
        view_numel *= shape[size_t(view_d)];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = ost[size_t(d - 1)];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

Tensor view(const Tensor& x, Shape shape) {
  shape = infer_shape("view", x, std::move(shape));
  Shape st;
  LOOM_CHECK(view_strides(x, shape, st), "view: cannot view ", x.shape(), " with strides ", x.strides(), " as ",
             shape, " without a copy (use reshape)");
  return make_view(x, shape, st, x.offset());
}

Tensor reshape(const Tensor& x, Shape shape) {
  shape = infer_shape("reshape", x, std::move(shape));
  Shape st;
  if (view_strides(x, shape, st)) return make_view(x, shape, st, x.offset());
  Tensor c = clone(x);
  return make_view(c, shape, contiguous_strides(shape), 0);
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  d0 = wrap("transpose", d0, x.dim());
  d1 = wrap("transpose", d1, x.dim());
  Shape sh = x.shape(), st = x.strides();
  std::swap(sh[size_t(d0)], sh[size_t(d1)]);
  std::swap(st[size_t(d0)], st[size_t(d1)]);
  return make_view(x, sh, st, x.offset());
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  LOOM_CHECK(int64_t(dims.size()) == x.dim(), "permute: ", dims.size(), " dims given for a ", x.dim(),
             "-d tensor of shape ", x.shape());
  Shape sh(dims.size()), st(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap("permute", dims[i], x.dim());
    LOOM_CHECK(!seen[size_t(d)], "permute: dim ", d, " repeated in ", Shape(dims));
    seen[size_t(d)] = true;
    sh[i] = x.shape()[size_t(d)];
    st[i] = x.strides()[size_t(d)];
  }
  return make_view(x, sh, st, x.offset());
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  dim = wrap("narrow", dim, x.dim());
  int64_t n = x.shape()[size_t(dim)];
  if (start < 0) start += n;
  LOOM_CHECK(start >= 0 && length >= 0 && start + length <= n, "narrow: [", start, ", ", start + length,
             ") out of range for dim ", dim, " of size ", n, " (shape ", x.shape(), ")");
  Shape sh = x.shape();
  sh[size_t(dim)] = length;
  return make_view(x, sh, x.strides(), x.offset() + start * x.strides()[size_t(dim)]);
}

Tensor cat_view(const std::vector<Tensor>& xs, int64_t dim) {
  if (xs.empty() || !xs[0].defined()) return Tensor();
  const Tensor& first = xs[0];
  dim = wrap("cat_view", dim, first.dim());
  const size_t d = size_t(dim);
  int64_t total = 0;
  for (const Tensor& x : xs) {
    if (!x.defined() || x.storage() != first.storage() || x.dtype() != first.dtype() || x.strides() != first.strides())
      return Tensor();  // (equal strides: equal dims too)
    for (size_t e = 0; e < size_t(x.dim()); ++e)
      if (e != d && x.shape()[e] != first.shape()[e]) return Tensor();
    if (x.offset() != first.offset() + total * first.strides()[d]) return Tensor();  // not where the last ended
    total += x.shape()[d];
  }
  Shape sh = first.shape();
  sh[d] = total;
  // No element twice: taken from the smallest stride up, each dim's stride must clear the extent of those
  // inside it (split's parts of a [B, T, 3C] tensor do; a dim whose stride the longer view runs into does not).
  std::vector<size_t> order;
  for (size_t e = 0; e < sh.size(); ++e)
    if (sh[e] > 1) order.push_back(e);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return first.strides()[a] < first.strides()[b]; });
  int64_t extent = 1;  // elements spanned by the dims so far
  for (size_t e : order) {
    if (first.strides()[e] < extent) return Tensor();
    extent = first.strides()[e] * (sh[e] - 1) + extent;
  }
  return make_view(first, sh, first.strides(), first.offset());
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  dim = wrap("unsqueeze", dim, x.dim() + 1);
  Shape sh = x.shape(), st = x.strides();
  int64_t s = dim < x.dim() ? st[size_t(dim)] * sh[size_t(dim)] : 1;
  sh.insert(sh.begin() + dim, 1);
  st.insert(st.begin() + dim, s);
  return make_view(x, sh, st, x.offset());
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  dim = wrap("squeeze", dim, x.dim());
  if (x.shape()[size_t(dim)] != 1) return x.alias();
  Shape sh = x.shape(), st = x.strides();
  sh.erase(sh.begin() + dim);
  st.erase(st.begin() + dim);
  return make_view(x, sh, st, x.offset());
}

Tensor squeeze(const Tensor& x) {
  Shape sh, st;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (x.shape()[size_t(d)] != 1) { sh.push_back(x.shape()[size_t(d)]); st.push_back(x.strides()[size_t(d)]); }
  return make_view(x, sh, st, x.offset());
}

Tensor expand(const Tensor& x, const Shape& shape) {
  LOOM_CHECK(int64_t(shape.size()) >= x.dim(), "expand: cannot expand ", x.shape(), " to fewer dims ", shape);
  Shape sh(shape.size()), st(shape.size());
  int64_t off = int64_t(shape.size()) - x.dim();
  for (int64_t i = int64_t(shape.size()) - 1; i >= 0; --i) {
    int64_t j = i - off;
    int64_t target = shape[size_t(i)];
    if (j < 0) {
      LOOM_CHECK(target >= 0, "expand: size -1 not allowed for new leading dim in ", shape);
      sh[size_t(i)] = target;
      st[size_t(i)] = 0;
      continue;
    }
    int64_t cur = x.shape()[size_t(j)];
    if (target == -1) target = cur;
    LOOM_CHECK(cur == target || cur == 1, "expand: cannot expand ", x.shape(), " to ", shape, " (dim ", i,
               ": ", cur, " vs ", target, ")");
    sh[size_t(i)] = target;
    st[size_t(i)] = cur == target ? x.strides()[size_t(j)] : 0;
  }
  return make_view(x, sh, st, x.offset());
}

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    LOOM_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", a, " and ", b, " cannot broadcast (dim ", i,
               ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace loom::ops
