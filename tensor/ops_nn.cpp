// Fused neural-net ops: softmax, log_softmax, layer_norm, embedding (the loss,
// cross_entropy, is in ops_loss.cpp). Each runs a per-row kernel from
// tensor/kernels/ on contiguous rows in the compute type (float64 stays double;
// everything else is computed in fp32 and rounded back to the input dtype). On
// a GPU each op hands over to cuda/rows.cu or cuda/embedding.cu, which call the
// same row functions from tensor/kernels/ in CUDA kernels.
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/parallel.h"
#include "tensor/cpu/rows.h"
#include "tensor/cuda/cuda_ops.h"
#include "tensor/kernels/column_partials.h"
#include "tensor/kernels/layernorm.h"
#include "tensor/kernels/softmax.h"
#include "tensor/profile.h"
#include "tensor/ops.h"

namespace loom::ops {

namespace {

using cpu::check_indices;
using cpu::compute_dtype;
using cpu::index_at;
using cpu::rows_of;

// Rows (of n values) per thread below which splitting a per-row loop does not pay.
int64_t row_grain(int64_t n) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)); }

// Runs row_fn(in_row, out_row, n, r) for every row r over the last dim of x
// (compute types only; x is not copied when it already is contiguous in its compute type).
template <class RowFn>
Tensor per_row_indexed(const char* op, const Tensor& x, RowFn row_fn) {
  profile::Scope prof(op, 4.0 * double(x.numel()), 2.0 * double(x.numel()) * double(element_size(x.dtype())));
  Tensor xc = rows_of(op, x);
  Tensor out = empty(xc.shape(), xc.dtype());
  int64_t n = x.size(-1), rows = n ? x.numel() / n : 0;
  auto run = [&](const auto* p, auto* o) {
    cpu::parallel_for(rows, row_grain(n), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) row_fn(p + r * n, o + r * n, n, r);
    });
  };
  if (xc.dtype() == kFloat64) run(xc.data<double>(), out.data<double>());
  else run(xc.data<float>(), out.data<float>());
  return to(out, x.dtype());
}

template <class RowFn>
Tensor per_row(const char* op, const Tensor& x, RowFn row_fn) {
  return per_row_indexed(op, x, [&](const auto* in, auto* out, int64_t n, int64_t) { row_fn(in, out, n); });
}

// Same for two inputs (grad, saved output) -> grad input.
template <class RowFn>
Tensor per_row2_indexed(const char* op, const Tensor& g, const Tensor& y, RowFn row_fn) {
  profile::Scope prof(op, 4.0 * double(g.numel()), 3.0 * double(g.numel()) * double(element_size(g.dtype())));
  LOOM_CHECK(g.shape() == y.shape(), op, ": grad ", g.shape(), " and output ", y.shape(), " differ");
  Tensor gc = rows_of(op, g), yc = rows_of(op, y);
  LOOM_CHECK(gc.dtype() == yc.dtype(), op, ": grad ", g.describe(), " and output ", y.describe(), " differ in dtype");
  Tensor out = empty(gc.shape(), gc.dtype());
  int64_t n = y.size(-1), rows = n ? y.numel() / n : 0;
  auto run = [&](const auto* gp, const auto* yp, auto* o) {
    cpu::parallel_for(rows, row_grain(n), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) row_fn(gp + r * n, yp + r * n, o + r * n, n, r);
    });
  };
  if (gc.dtype() == kFloat64) run(gc.data<double>(), yc.data<double>(), out.data<double>());
  else run(gc.data<float>(), yc.data<float>(), out.data<float>());
  return to(out, g.dtype());
}

template <class RowFn>
Tensor per_row2(const char* op, const Tensor& g, const Tensor& y, RowFn row_fn) {
  return per_row2_indexed(op, g, y, [&](const auto* dy, const auto* yy, auto* dx, int64_t n, int64_t) {
    row_fn(dy, yy, dx, n);
  });
}

}  // namespace

Tensor softmax(const Tensor& x) {
  if (x.device().is_cuda()) return cuda::softmax(x);
  return per_row("softmax", x, [](const auto* in, auto* out, int64_t n) { kernels::softmax_row(in, out, long(n)); });
}

Tensor log_softmax(const Tensor& x) {
  if (x.device().is_cuda()) return cuda::log_softmax(x);
  return per_row("log_softmax", x,
                 [](const auto* in, auto* out, int64_t n) { kernels::log_softmax_row(in, out, long(n)); });
}

Tensor softmax_backward(const Tensor& grad, const Tensor& y) {
  if (y.device().is_cuda()) return cuda::softmax_backward(grad, y);
  return per_row2("softmax_backward", grad, y, [](const auto* dy, const auto* yy, auto* dx, int64_t n) {
    kernels::softmax_backward_row(dy, yy, dx, long(n));
  });
}

Tensor log_softmax_backward(const Tensor& grad, const Tensor& y) {
  if (y.device().is_cuda()) return cuda::log_softmax_backward(grad, y);
  return per_row2("log_softmax_backward", grad, y, [](const auto* dy, const auto* yy, auto* dx, int64_t n) {
    kernels::log_softmax_backward_row(dy, yy, dx, long(n));
  });
}

// Row r of x viewed as [rows, S] is query t = r % T of its [T, S] block: it sees min(t + 1, S) keys.
Tensor causal_softmax(const Tensor& x, double scale) {
  LOOM_CHECK(x.dim() >= 2, "causal_softmax: needs [..., T, S] scores, got ", x.shape());
  if (x.device().is_cuda()) return cuda::causal_softmax(x, scale);
  const int64_t T = x.size(-2);
  return per_row_indexed("causal_softmax", x, [T, scale](const auto* in, auto* out, int64_t n, int64_t r) {
    using S = std::remove_cvref_t<decltype(*in)>;
    kernels::causal_softmax_row(in, out, long(n), long(std::min(r % T + 1, n)), S(scale));
  });
}

Tensor causal_softmax_backward(const Tensor& grad, const Tensor& y, double scale) {
  LOOM_CHECK(y.dim() >= 2, "causal_softmax_backward: needs [..., T, S], got ", y.shape());
  if (y.device().is_cuda()) return cuda::causal_softmax_backward(grad, y, scale);
  const int64_t T = y.size(-2);
  return per_row2_indexed("causal_softmax_backward", grad, y,
                          [T, scale](const auto* dy, const auto* yy, auto* dx, int64_t n, int64_t r) {
                            using S = std::remove_cvref_t<decltype(*dy)>;
                            kernels::causal_softmax_backward_row(dy, yy, dx, long(n), long(std::min(r % T + 1, n)),
                                                                 S(scale));
                          });
}

LayerNormResult layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  profile::Scope prof("layer_norm fwd", 8.0 * double(x.numel()), 2.0 * double(x.numel()) * double(element_size(x.dtype())));
  LOOM_CHECK(x.dim() >= 1, "layer_norm: expected at least 1 dim, got a scalar");
  int64_t C = x.size(-1), rows = C ? x.numel() / C : 0;
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    LOOM_CHECK(p->dim() == 1 && p->size(0) == C && p->dtype() == x.dtype(), "layer_norm: input ", x.describe(),
               " needs weight/bias of shape [", C, "] and the same dtype, got ", p->describe());
    LOOM_CHECK(p->device() == x.device(), "layer_norm: input on ", x.device().str(), ", weight/bias on ",
               p->device().str());
  }
  if (x.device().is_cuda()) return cuda::layer_norm(x, weight, bias, eps);
  Tensor xc = rows_of("layer_norm", x);
  DType cd = xc.dtype();
  Tensor w = weight.defined() ? contiguous(to(weight, cd)) : Tensor();
  Tensor b = bias.defined() ? contiguous(to(bias, cd)) : Tensor();
  Tensor y = empty(xc.shape(), cd), mean = empty({rows}, cd), rstd = empty({rows}, cd);
  LOOM_DISPATCH_COMPUTE(cd, "layer_norm", {
    {
      const scalar_t* wp = w.defined() ? w.data<scalar_t>() : nullptr;
      const scalar_t* bp = b.defined() ? b.data<scalar_t>() : nullptr;
      const scalar_t* xp = xc.data<scalar_t>();
      scalar_t *yp = y.data<scalar_t>(), *mp = mean.data<scalar_t>(), *rp = rstd.data<scalar_t>();
      cpu::parallel_for(rows, row_grain(C), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          kernels::layernorm_row(xp + r * C, wp, bp, yp + r * C, long(C), scalar_t(eps), mp + r, rp + r);
      });
    }
  });
  return {to(y, x.dtype()), mean, rstd};
}

LayerNormGrads layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& rstd) {
  profile::Scope prof("layer_norm bwd", 12.0 * double(x.numel()), 3.0 * double(x.numel()) * double(element_size(x.dtype())));
  if (x.device().is_cuda()) return cuda::layer_norm_backward(grad, x, weight, mean, rstd);
  Tensor gc = rows_of("layer_norm_backward", grad), xc = rows_of("layer_norm_backward", x);
  DType cd = xc.dtype();
  int64_t C = x.size(-1), rows = C ? x.numel() / C : 0;
  Tensor w = weight.defined() ? contiguous(to(weight, cd)) : Tensor();
  Tensor dx = empty(xc.shape(), cd), dw = zeros({C}, cd), db = zeros({C}, cd);
  LOOM_DISPATCH_COMPUTE(cd, "layer_norm_backward", {
    {
      const scalar_t* wp = w.defined() ? w.data<scalar_t>() : nullptr;
      const scalar_t *gp = gc.data<scalar_t>(), *xp = xc.data<scalar_t>();
      const scalar_t *mp = mean.data<scalar_t>(), *rp = rstd.data<scalar_t>();
      scalar_t *dxp = dx.data<scalar_t>(), *dwp = dw.data<scalar_t>(), *dbp = db.data<scalar_t>();
      // dw and db sum every row into each column, in two passes
      // (kernels/column_partials.h, the fast GPU kernel's order): each block of
      // kRowsPerPartial rows sums its rows in row order, in the pass that
      // writes their dx, then the blocks' sums are added in block order. The
      // order depends on the rows alone, so any thread count gives the same
      // bits, and g and x are read once. (Split by columns after a pass for
      // dx, as before, the second pass over g and x cost 2 threads as much as
      // the whole op did one: the medium GPT's main thread 7.6-10.6 ms a step
      // at 2 threads, now 3.9-4.7; bench/README.md.)
      const int64_t per = kernels::kRowsPerPartial, blocks = kernels::partial_blocks(long(rows), long(per));
      std::vector<scalar_t> part(size_t(2 * blocks * C), scalar_t(0));  // [blocks, C] of dw, then of db
      cpu::parallel_chunks(blocks, std::max<int64_t>(1, row_grain(C) / per), 1, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b)
          for (int64_t r = b * per; r < std::min(rows, (b + 1) * per); ++r)
            kernels::layernorm_backward_row(gp + r * C, xp + r * C, wp, mp[r], rp[r], dxp + r * C,
                                            part.data() + b * C, part.data() + (blocks + b) * C, long(C));
      });
      for (int64_t c = 0; c < C; ++c) {
        dwp[c] = kernels::sum_of_partials(part.data(), long(blocks), long(C), long(c));
        dbp[c] = kernels::sum_of_partials(part.data() + blocks * C, long(blocks), long(C), long(c));
      }
    }
  });
  DType wd = weight.defined() ? weight.dtype() : x.dtype();
  return {to(dx, x.dtype()), to(dw, wd), to(db, wd)};
}

Tensor embedding(const Tensor& weight, const Tensor& idx) {
  const double weight_row_bytes = double(weight.numel() / std::max<int64_t>(1, weight.dim() ? weight.size(0) : 1)) *
                                  double(element_size(weight.dtype()));
  profile::Scope prof("embedding fwd", 0, 2.0 * double(idx.numel()) * weight_row_bytes);  // rows read, then written
  check_indices("embedding", idx);
  LOOM_CHECK(weight.dim() == 2, "embedding: weight must be [V, C], got ", weight.shape());
  if (weight.device().is_cuda() || idx.device().is_cuda()) return cuda::embedding(weight, idx);
  Tensor w = contiguous(weight), ic = contiguous(idx);
  int64_t V = weight.size(0), C = weight.size(1);
  Shape out_shape = idx.shape();
  out_shape.push_back(C);
  Tensor out = empty(out_shape, weight.dtype());
  size_t row_bytes = size_t(C) * element_size(weight.dtype());
  const char* src = static_cast<const char*>(w.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  for (int64_t i = 0; i < ic.numel(); ++i) {
    int64_t t = index_at(ic, i);
    LOOM_CHECK(t >= 0 && t < V, "embedding: index ", t, " out of range for ", V, " rows (weight ", weight.shape(),
               ")");
    std::memcpy(dst + size_t(i) * row_bytes, src + size_t(t) * row_bytes, row_bytes);
  }
  return out;
}

Tensor embedding_backward(const Tensor& grad, const Tensor& idx, int64_t num_rows) {
  profile::Scope prof("embedding bwd", double(grad.numel()), 3.0 * double(grad.numel()) * double(element_size(grad.dtype())));
  check_indices("embedding_backward", idx);
  int64_t C = grad.size(-1);
  LOOM_CHECK(grad.numel() == idx.numel() * C, "embedding_backward: grad ", grad.shape(), " does not match indices ",
             idx.shape());
  if (grad.device().is_cuda() || idx.device().is_cuda()) return cuda::embedding_backward(grad, idx, num_rows);
  DType cd = compute_dtype(grad.dtype());
  Tensor g = contiguous(to(grad, cd)), ic = contiguous(idx);
  Tensor out = zeros({num_rows, C}, cd);
  LOOM_DISPATCH_COMPUTE(cd, "embedding_backward", {
    const scalar_t* gp = g.data<scalar_t>();
    scalar_t* op = out.data<scalar_t>();
    for (int64_t i = 0; i < ic.numel(); ++i) {
      int64_t t = index_at(ic, i);
      LOOM_CHECK(t >= 0 && t < num_rows, "embedding_backward: index ", t, " out of range for ", num_rows, " rows");
      for (int64_t c = 0; c < C; ++c) op[t * C + c] += gp[i * C + c];
    }
  });
  return to(out, grad.dtype());
}

}  // namespace loom::ops
