// The per-row kernels of ops_nn.cpp on the GPU: softmax, log_softmax, the
// causal softmax and their backwards, layer_norm and rms_norm (one wrapper)
// and their backwards, rope. Each kernel calls the LOOM_HOST_DEVICE row
// function from tensor/kernels/ - the code the CPU loops call - so the CPU
// tests cover this math too.
//
// One thread per row: the plainest mapping of "the same function, one row at
// a time". It is correct for any row length and deterministic (a row's sums
// run in the order row_sum fixes); it is not fast for long rows, whose reads
// are not coalesced across a warp. Faster kernels (a warp or block per row,
// llm.c's) are in fast/ (fast_ops.h), chosen by LOOM_CUDA_KERNELS=fast.
//
//   x: [..., n] viewed as [rows, n], contiguous, in the compute dtype
//   (float64 stays double, everything else fp32); results rounded back.
#include <algorithm>

#include "tensor/cpu/dispatch.h"
#include "tensor/cuda/cuda_ops.h"
#include "tensor/cuda/fast/fast_ops.h"
#include "tensor/cuda/launch.cuh"
#include "tensor/kernels/layernorm.h"
#include "tensor/kernels/rmsnorm.h"
#include "tensor/kernels/rope.h"
#include "tensor/kernels/softmax.h"

namespace loom::cuda {
namespace {

DType compute_dtype(DType t) { return t == kFloat64 ? kFloat64 : kFloat32; }

// The checks of cpu/rows.h's rows_of, then a contiguous copy in the compute dtype.
Tensor rows_of(const char* op, const Tensor& x) {
  LOOM_CHECK(is_floating(x.dtype()), op, ": expected a floating tensor, got ", x.describe());
  LOOM_CHECK(x.dim() >= 1, op, ": expected at least 1 dim, got a scalar");
  return ops::contiguous(ops::to(x, compute_dtype(x.dtype())));
}

// ---- row functions: row r of x (and of a second input) -> row r of out ----
struct SoftmaxRow {
  template <class T> __device__ void operator()(const T* x, T* y, long n, long) const { kernels::softmax_row(x, y, n); }
};
struct LogSoftmaxRow {
  template <class T> __device__ void operator()(const T* x, T* y, long n, long) const {
    kernels::log_softmax_row(x, y, n);
  }
};
// Row r is query t = r % T of its [T, S] block: it sees min(t + 1, S) keys.
struct CausalSoftmaxRow {
  long T;
  double scale;
  template <class S> __device__ void operator()(const S* x, S* y, long n, long r) const {
    kernels::causal_softmax_row(x, y, n, r % T + 1 < n ? r % T + 1 : n, S(scale));
  }
};
struct SoftmaxBackwardRow {
  template <class T> __device__ void operator()(const T* dy, const T* y, T* dx, long n, long) const {
    kernels::softmax_backward_row(dy, y, dx, n);
  }
};
struct LogSoftmaxBackwardRow {
  template <class T> __device__ void operator()(const T* dy, const T* y, T* dx, long n, long) const {
    kernels::log_softmax_backward_row(dy, y, dx, n);
  }
};
struct CausalSoftmaxBackwardRow {
  long T;
  double scale;
  template <class S> __device__ void operator()(const S* dy, const S* y, S* dx, long n, long r) const {
    kernels::causal_softmax_backward_row(dy, y, dx, n, r % T + 1 < n ? r % T + 1 : n, S(scale));
  }
};

// Row r of each input (one, or grad and saved output) -> row r of out.
template <class Row, class T, class... In>
__global__ void rows_kernel(Row row, T* out, int64_t rows, int64_t n, const In*... in) {
  LOOM_GRID_STRIDE_LOOP(r, rows) row((in + r * n)..., out + r * n, long(n), long(r));
}

// Launches row over the rows of the inputs (contiguous, in the compute dtype, one shape).
template <class Row, class... In>
Tensor launch_rows(const char* op, Row row, const Tensor& first, const In&... rest) {
  Tensor out = empty(first.shape(), first.dtype(), first.device());
  const int64_t n = first.size(-1), rows = n ? first.numel() / n : 0;
  if (rows > 0) {
    DeviceGuard guard(first.device());
    LaunchConfig c = launch_config(rows);
    cudaStream_t st = stream(first.device());
    LOOM_DISPATCH_COMPUTE(first.dtype(), op, {
      rows_kernel<<<c.blocks, c.threads, 0, st>>>(row, ptr<scalar_t>(out), rows, n, ptr<scalar_t>(first),
                                                  ptr<scalar_t>(rest)...);
    });
    CUDA_CHECK_LAUNCH();
  }
  return out;
}

template <class Row>
Tensor per_row(const char* op, const Tensor& x, Row row) {
  return ops::to(launch_rows(op, row, rows_of(op, x)), x.dtype());
}

// (grad, saved output) -> grad input
template <class Row>
Tensor per_row2(const char* op, const Tensor& g, const Tensor& y, Row row) {
  LOOM_CHECK(g.shape() == y.shape(), op, ": grad ", g.shape(), " and output ", y.shape(), " differ");
  LOOM_CHECK(g.device() == y.device(), op, ": grad on ", g.device().str(), ", output on ", y.device().str());
  Tensor gc = rows_of(op, g), yc = rows_of(op, y);
  LOOM_CHECK(gc.dtype() == yc.dtype(), op, ": grad ", g.describe(), " and output ", y.describe(), " differ in dtype");
  return ops::to(launch_rows(op, row, gc, yc), g.dtype());
}

// ---- layer norm and RMSNorm: x [rows, C]; w, b [C] or null; mean (layer norm's), rstd [rows] ----
// RMSNorm is layer norm without the mean and the bias (kernels/rmsnorm.h):
// each kernel serves both, its row function chosen at compile time.
template <class T, bool kRms>
__global__ void norm_kernel(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t rows, int64_t C,
                            T eps) {
  LOOM_GRID_STRIDE_LOOP(r, rows) {
    if constexpr (kRms) kernels::rmsnorm_row(x + r * C, w, y + r * C, long(C), eps, rstd + r);
    else kernels::layernorm_row(x + r * C, w, b, y + r * C, long(C), eps, mean + r, rstd + r);
  }
}

// dx, one thread per row (dw/db are left to the column kernel below).
template <class T, bool kRms>
__global__ void norm_backward_kernel(const T* dy, const T* x, const T* w, const T* mean, const T* rstd, T* dx,
                                     int64_t rows, int64_t C) {
  T* none = nullptr;
  LOOM_GRID_STRIDE_LOOP(r, rows) {
    if constexpr (kRms) kernels::rmsnorm_backward_row(dy + r * C, x + r * C, w, rstd[r], dx + r * C, none, long(C));
    else kernels::layernorm_backward_row(dy + r * C, x + r * C, w, mean[r], rstd[r], dx + r * C, none, none, long(C));
  }
}

// dw (and layer norm's db): one thread per column, adding the rows in row
// order - the CPU's order, no atomics, so the same bits on every run.
template <class T, bool kRms>
__global__ void norm_param_grads_kernel(const T* dy, const T* x, const T* mean, const T* rstd, T* dw, T* db,
                                        int64_t rows, int64_t C) {
  LOOM_GRID_STRIDE_LOOP(c, C)
  for (int64_t r = 0; r < rows; ++r) {
    if constexpr (kRms) kernels::rmsnorm_weight_grad_row(dy + r * C, x + r * C, rstd[r], dw, long(c), long(c + 1));
    else kernels::layernorm_param_grads_row(dy + r * C, x + r * C, mean[r], rstd[r], dw, db, long(c), long(c + 1));
  }
}

// ---- RoPE: x [rows, hd], row r at position r % T; cos, sin [T, hd/2] ----
template <class T>
__global__ void rope_kernel(const T* x, T* y, const T* cos, const T* sin, T sign, int64_t rows, int64_t T_,
                            int64_t hd) {
  LOOM_GRID_STRIDE_LOOP(r, rows) {
    const int64_t t = r % T_, h = hd / 2;
    kernels::rope_row(x + r * hd, y + r * hd, long(hd), cos + t * h, sin + t * h, sign);
  }
}

}  // namespace

Tensor softmax(const Tensor& x) {
  if (fast::use_fast(x)) return fast::softmax(x);
  return per_row("softmax", x, SoftmaxRow{}); }
Tensor log_softmax(const Tensor& x) {
  if (fast::use_fast(x)) return fast::log_softmax(x);
  return per_row("log_softmax", x, LogSoftmaxRow{}); }
Tensor softmax_backward(const Tensor& grad, const Tensor& y) {
  if (fast::use_fast(grad) && fast::use_fast(y)) return fast::softmax_backward(grad, y);
  return per_row2("softmax_backward", grad, y, SoftmaxBackwardRow{});
}
Tensor log_softmax_backward(const Tensor& grad, const Tensor& y) {
  if (fast::use_fast(grad) && fast::use_fast(y)) return fast::log_softmax_backward(grad, y);
  return per_row2("log_softmax_backward", grad, y, LogSoftmaxBackwardRow{});
}
Tensor causal_softmax(const Tensor& x, double scale) {
  LOOM_CHECK(x.dim() >= 2, "causal_softmax: needs [..., T, S] scores, got ", x.shape());
  if (fast::use_fast(x)) return fast::causal_softmax(x, scale);
  return per_row("causal_softmax", x, CausalSoftmaxRow{long(x.size(-2)), scale});
}
Tensor causal_softmax_backward(const Tensor& grad, const Tensor& y, double scale) {
  LOOM_CHECK(y.dim() >= 2, "causal_softmax_backward: needs [..., T, S], got ", y.shape());
  if (fast::use_fast(grad) && fast::use_fast(y)) return fast::causal_softmax_backward(grad, y, scale);
  return per_row2("causal_softmax_backward", grad, y, CausalSoftmaxBackwardRow{long(y.size(-2)), scale});
}

namespace {

template <class T>
T* ptr_or_null(const Tensor& t) { return t.defined() ? ptr<T>(t) : nullptr; }

// A norm's weight or bias in the compute dtype (undefined stays undefined).
Tensor in_compute(const Tensor& t, DType cd) { return t.defined() ? ops::contiguous(ops::to(t, cd)) : Tensor(); }

// Layer norm, or with rms RMSNorm (no mean, no bias: mean comes back undefined).
ops::LayerNormResult norm(const char* op, bool rms, const Tensor& x, const Tensor& weight, const Tensor& bias,
                          double eps) {
  Tensor xc = rows_of(op, x);
  const int64_t C = x.size(-1), rows = C ? x.numel() / C : 0;
  const DType cd = xc.dtype();
  Tensor w = in_compute(weight, cd), b = in_compute(bias, cd);
  Tensor y = empty(xc.shape(), cd, x.device()), rstd = empty({rows}, cd, x.device());
  Tensor mean = rms ? Tensor() : empty({rows}, cd, x.device());
  if (rows > 0) {
    DeviceGuard guard(x.device());
    LaunchConfig c = launch_config(rows);
    cudaStream_t st = stream(x.device());
    LOOM_DISPATCH_COMPUTE(cd, op, {
      auto kernel = rms ? norm_kernel<scalar_t, true> : norm_kernel<scalar_t, false>;
      kernel<<<c.blocks, c.threads, 0, st>>>(ptr<scalar_t>(xc), ptr_or_null<scalar_t>(w), ptr_or_null<scalar_t>(b),
                                             ptr<scalar_t>(y), ptr_or_null<scalar_t>(mean), ptr<scalar_t>(rstd), rows,
                                             C, scalar_t(eps));
    });
    CUDA_CHECK_LAUNCH();
  }
  return {ops::to(y, x.dtype()), mean, rstd};
}

ops::LayerNormGrads norm_backward(const char* op, bool rms, const Tensor& grad, const Tensor& x, const Tensor& weight,
                                  const Tensor& mean, const Tensor& rstd) {
  Tensor gc = rows_of(op, grad), xc = rows_of(op, x);
  const DType cd = xc.dtype();
  const int64_t C = x.size(-1), rows = C ? x.numel() / C : 0;
  Tensor w = in_compute(weight, cd);
  Tensor dx = empty(xc.shape(), cd, x.device()), dw = zeros({C}, cd, x.device());
  Tensor db = rms ? Tensor() : zeros({C}, cd, x.device());
  if (rows > 0) {
    DeviceGuard guard(x.device());
    cudaStream_t st = stream(x.device());
    LaunchConfig by_row = launch_config(rows), by_column = launch_config(C);
    LOOM_DISPATCH_COMPUTE(cd, op, {
      const scalar_t *gp = ptr<scalar_t>(gc), *xp = ptr<scalar_t>(xc);
      const scalar_t *mp = ptr_or_null<scalar_t>(mean), *rp = ptr<scalar_t>(rstd);
      auto rows_kernel = rms ? norm_backward_kernel<scalar_t, true> : norm_backward_kernel<scalar_t, false>;
      rows_kernel<<<by_row.blocks, by_row.threads, 0, st>>>(gp, xp, ptr_or_null<scalar_t>(w), mp, rp,
                                                            ptr<scalar_t>(dx), rows, C);
      CUDA_CHECK_LAUNCH();
      auto columns_kernel = rms ? norm_param_grads_kernel<scalar_t, true> : norm_param_grads_kernel<scalar_t, false>;
      columns_kernel<<<by_column.blocks, by_column.threads, 0, st>>>(gp, xp, mp, rp, ptr<scalar_t>(dw),
                                                                     ptr_or_null<scalar_t>(db), rows, C);
      CUDA_CHECK_LAUNCH();
    });
  }
  const DType wd = weight.defined() ? weight.dtype() : x.dtype();
  return {ops::to(dx, x.dtype()), ops::to(dw, wd), rms ? Tensor() : ops::to(db, wd)};
}

}  // namespace

// weight/bias shapes and dtypes are checked by ops::layer_norm and ops::rms_norm.
ops::LayerNormResult layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  if (fast::use_fast(x)) return fast::layer_norm(x, weight, bias, eps);
  return norm("layer_norm", /*rms=*/false, x, weight, bias, eps);
}

ops::LayerNormGrads layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                        const Tensor& rstd) {
  if (fast::use_fast(grad) && fast::use_fast(x)) return fast::layer_norm_backward(grad, x, weight, mean, rstd);
  return norm_backward("layer_norm_backward", /*rms=*/false, grad, x, weight, mean, rstd);
}

ops::RMSNormResult rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  ops::LayerNormResult r = norm("rms_norm", /*rms=*/true, x, weight, Tensor(), eps);
  return {r.y, r.rstd};
}

ops::RMSNormGrads rms_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight, const Tensor& rstd) {
  ops::LayerNormGrads g = norm_backward("rms_norm_backward", /*rms=*/true, grad, x, weight, Tensor(), rstd);
  return {g.dx, g.dweight};
}

Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse) {
  Tensor xc = rows_of("rope", x);
  const DType cd = xc.dtype();
  LOOM_CHECK(cos.dtype() == cd && sin.dtype() == cd, "rope: the cos/sin tables must be ", dtype_name(cd));
  const int64_t T = x.size(-2), hd = x.size(-1), rows = hd ? x.numel() / hd : 0;
  Tensor y = empty(xc.shape(), cd, x.device());
  if (rows > 0) {
    DeviceGuard guard(x.device());
    LaunchConfig c = launch_config(rows);
    cudaStream_t st = stream(x.device());
    LOOM_DISPATCH_COMPUTE(cd, "rope", {
      rope_kernel<<<c.blocks, c.threads, 0, st>>>(ptr<scalar_t>(xc), ptr<scalar_t>(y), ptr<scalar_t>(cos),
                                                  ptr<scalar_t>(sin), inverse ? scalar_t(-1) : scalar_t(1), rows, T,
                                                  hd);
    });
    CUDA_CHECK_LAUNCH();
  }
  return ops::to(y, x.dtype());
}

}  // namespace loom::cuda
