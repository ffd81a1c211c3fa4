// Reductions: sum / mean / max over dims with keepdim, and sum_to (the
// gradient of broadcasting). Sums accumulate in double so results do not depend
// on how the reduced dims are laid out.
#include <algorithm>
#include <limits>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/loops.h"
#include "tensor/cuda/cuda_ops.h"
#include "tensor/profile.h"
#include "tensor/ops.h"

namespace loom::ops {

static std::vector<bool> reduced_mask(const char* op, const Tensor& x, std::vector<int64_t>& dims) {
  std::vector<bool> red(size_t(x.dim()), false);
  for (int64_t& d : dims) {
    LOOM_CHECK(d >= -x.dim() && d < x.dim(), op, ": dim ", d, " out of range for shape ", x.shape());
    if (d < 0) d += x.dim();
    LOOM_CHECK(!red[size_t(d)], op, ": dim ", d, " repeated");
    red[size_t(d)] = true;
  }
  return red;
}

// Sums x over the dims marked in `red` into a float64 tensor of the kept shape
// (reduced dims have size 1). x is walked in place and each element lands at
// its kept index (stride 0 on reduced dims).
static Tensor sum_in_double(const Tensor& x, const std::vector<bool>& red) {
  LOOM_CHECK(is_floating(x.dtype()), "sum: dtype ", dtype_name(x.dtype()), " is not supported (floating dtypes only)");
  if (x.device().is_cuda()) return cuda::sum_in_double(x, red);  // a block per output, a fixed-order tree
  Shape keep_shape = x.shape();
  for (size_t d = 0; d < red.size(); ++d) if (red[d]) keep_shape[d] = 1;
  Tensor acc = zeros(keep_shape, kFloat64);
  Tensor acc_view = expand(acc, x.shape());
  LOOM_DISPATCH_FLOAT(x.dtype(), "sum", {
    cpu::strided_loop<2>(x.shape(), {acc_view.strides(), x.strides()},
                         {static_cast<char*>(acc.raw_data()), static_cast<char*>(x.raw_data())},
                         {8, int64_t(sizeof(scalar_t))},
                         [](int64_t n, std::array<char*, 2> p, std::array<int64_t, 2> s) {
                           double* o = reinterpret_cast<double*>(p[0]);
                           const scalar_t* v = reinterpret_cast<const scalar_t*>(p[1]);
                           if (s[0] == 0) {
                             double t = 0;
                             for (int64_t i = 0; i < n; ++i) t += double(cpu::to_acc(v[i * s[1]]));
                             *o += t;
                           } else if (s[0] == 1 && s[1] == 1) {  // e.g. a bias gradient: rows summed column-wise
                             for (int64_t i = 0; i < n; ++i) o[i] += double(cpu::to_acc(v[i]));
                           } else {
                             for (int64_t i = 0; i < n; ++i) o[i * s[0]] += double(cpu::to_acc(v[i * s[1]]));
                           }
                         });
  });
  return acc;
}

// Rounds a float64 result to x's dtype once, and drops the reduced dims unless keepdim.
static Tensor finish_reduction(const Tensor& acc, const Tensor& x, const std::vector<bool>& red, bool keepdim) {
  Tensor out = to(acc, x.dtype());
  if (keepdim) return out;
  Shape sh;
  for (size_t d = 0; d < red.size(); ++d) if (!red[d]) sh.push_back(x.shape()[d]);
  return view(out, sh);
}

static std::vector<int64_t> all_dims(const Tensor& x) {
  std::vector<int64_t> all(size_t(x.dim()));
  for (int64_t d = 0; d < x.dim(); ++d) all[size_t(d)] = d;
  return all;
}

Tensor sum(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  profile::Scope prof("sum", double(x.numel()), double(x.numel()) * double(element_size(x.dtype())));
  std::vector<bool> red = reduced_mask("sum", x, dims);
  return finish_reduction(sum_in_double(x, red), x, red, keepdim);
}

Tensor sum(const Tensor& x) { return sum(x, all_dims(x), false); }

// The division happens on the double sum, so a bf16/fp16 mean is rounded once
// (rounding the sum to bf16 first can move the mean by an ulp).
Tensor mean(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  std::vector<bool> red = reduced_mask("mean", x, dims);
  int64_t count = 1;
  for (size_t i = 0; i < red.size(); ++i) if (red[i]) count *= x.shape()[i];
  return finish_reduction(mul(sum_in_double(x, red), 1.0 / double(count)), x, red, keepdim);
}

Tensor mean(const Tensor& x) { return mean(x, all_dims(x), false); }

std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) {
  LOOM_CHECK(dim >= -x.dim() && dim < x.dim(), "max: dim ", dim, " out of range for shape ", x.shape());
  if (dim < 0) dim += x.dim();
  int64_t n = x.shape()[size_t(dim)];
  LOOM_CHECK(n > 0, "max: dim ", dim, " of shape ", x.shape(), " is empty");
  // Move `dim` last and make rows contiguous: [rows, n].
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < x.dim(); ++d) if (d != dim) perm.push_back(d);
  perm.push_back(dim);
  Tensor xp = contiguous(permute(x, perm));
  int64_t rows = x.numel() / n;
  Shape keep_shape = x.shape();
  keep_shape[size_t(dim)] = 1;
  Tensor values = empty(keep_shape, x.dtype(), x.device());
  Tensor indices = empty(keep_shape, kInt64, x.device());
  if (x.device().is_cuda()) cuda::max_rows(reshape(xp, {rows, n}), values, indices);
  else LOOM_DISPATCH_FLOAT(x.dtype(), "max", {
    const scalar_t* p = xp.data<scalar_t>();
    scalar_t* vo = values.data<scalar_t>();
    int64_t* io = indices.data<int64_t>();
    for (int64_t r = 0; r < rows; ++r) {
      const scalar_t* row = p + r * n;
      int64_t best = 0;
      acc_t bv = cpu::to_acc(row[0]);
      for (int64_t i = 1; i < n; ++i) {
        acc_t v = cpu::to_acc(row[i]);
        if (v > bv) { bv = v; best = i; }
      }
      vo[r] = row[best];
      io[r] = best;
    }
  });
  if (!keepdim) {
    values = squeeze(values, dim);
    indices = squeeze(indices, dim);
  }
  return {values, indices};
}

Tensor max(const Tensor& x) {
  LOOM_CHECK(x.numel() > 0, "max: tensor of shape ", x.shape(), " is empty");
  return view(max(reshape(x, {-1}), 0, false).first, {});
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  LOOM_CHECK(x.dim() >= int64_t(shape.size()), "sum_to: cannot reduce ", x.shape(), " to ", shape);
  int64_t lead = x.dim() - int64_t(shape.size());
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d < lead) { dims.push_back(d); continue; }
    int64_t target = shape[size_t(d - lead)];
    if (target == 1 && x.shape()[size_t(d)] != 1) dims.push_back(d);
    else LOOM_CHECK(target == x.shape()[size_t(d)], "sum_to: cannot reduce ", x.shape(), " to ", shape);
  }
  return reshape(sum(x, dims, true), shape);
}

}  // namespace loom::ops
