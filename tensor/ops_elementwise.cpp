// Elementwise math: binary ops with numpy broadcasting, scalar variants and
// unary functions. Each op is a lambda on compute values (acc_t) run by the
// strided loop in cpu/loops.h; bf16/fp16 convert in and round out per element.
// On a GPU the same ops run as cuda/elementwise.cu's kernels, named by the
// cuda::Unary / cuda::Binary code each op passes along.
#include <cmath>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/gelu_vec.h"
#include "tensor/cpu/loops.h"
#include "tensor/cuda/cuda_ops.h"
#include "tensor/kernels/gelu.h"
#include "tensor/kernels/silu.h"
#include "tensor/profile.h"
#include "tensor/ops.h"

namespace loom::ops {

namespace {

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  LOOM_CHECK(a.dtype() == b.dtype(), op, ": dtypes differ: ", a.describe(), " and ", b.describe());
  LOOM_CHECK(a.device() == b.device(), op, ": devices differ: ", a.device().str(), " and ", b.device().str());
}

void check_float(const char* op, const Tensor& a) {
  LOOM_CHECK(is_floating(a.dtype()), op, ": dtype ", dtype_name(a.dtype()), " is not supported (floating dtypes only)");
}

template <class F>
Tensor binary(const char* op, cuda::Binary code, const Tensor& a, const Tensor& b, F f) {
  profile::Scope prof(op, double(std::max(a.numel(), b.numel())),
                      double(a.numel() + b.numel() + std::max(a.numel(), b.numel())) * double(element_size(a.dtype())));
  check_same_dtype(op, a, b);
  if (a.device().is_cuda()) {
    check_float(op, a);
    return cuda::binary(code, a, b);
  }
  check_device_supported(op, a.device());
  Tensor out = empty(broadcast_shapes(op, a.shape(), b.shape()), a.dtype(), a.device());
  LOOM_DISPATCH_FLOAT(a.dtype(), op, {
    cpu::binary_loop<scalar_t, scalar_t, scalar_t>(out, a, b, [&](scalar_t x, scalar_t y) {
      return cpu::from_acc<scalar_t>(f(acc_t(cpu::to_acc(x)), acc_t(cpu::to_acc(y))));
    });
  });
  return out;
}

template <class F>
Tensor unary(const char* op, cuda::Unary code, double s, const Tensor& a, F f) {
  profile::Scope prof(op, double(a.numel()), 2.0 * double(a.numel()) * double(element_size(a.dtype())));
  if (a.device().is_cuda()) {
    check_float(op, a);
    return cuda::unary(code, a, s);
  }
  check_device_supported(op, a.device());
  Tensor out = empty(a.shape(), a.dtype(), a.device());
  LOOM_DISPATCH_FLOAT(a.dtype(), op, {
    cpu::unary_loop<scalar_t, scalar_t>(out, a, [&](scalar_t x) {
      return cpu::from_acc<scalar_t>(f(acc_t(cpu::to_acc(x))));
    });
  });
  return out;
}

}  // namespace

using U = cuda::Unary;
using B = cuda::Binary;

Tensor add(const Tensor& a, const Tensor& b) { return binary("add", B::Add, a, b, [](auto x, auto y) { return x + y; }); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary("sub", B::Sub, a, b, [](auto x, auto y) { return x - y; }); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary("mul", B::Mul, a, b, [](auto x, auto y) { return x * y; }); }
Tensor div(const Tensor& a, const Tensor& b) { return binary("div", B::Div, a, b, [](auto x, auto y) { return x / y; }); }

Tensor add(const Tensor& a, double s) {
  return unary("add", U::AddScalar, s, a, [s](auto x) { return x + decltype(x)(s); });
}
Tensor mul(const Tensor& a, double s) {
  return unary("mul", U::MulScalar, s, a, [s](auto x) { return x * decltype(x)(s); });
}
Tensor rsub(double s, const Tensor& a) {
  return unary("rsub", U::RSub, s, a, [s](auto x) { return decltype(x)(s) - x; });
}
Tensor rdiv(double s, const Tensor& a) {
  return unary("rdiv", U::RDiv, s, a, [s](auto x) { return decltype(x)(s) / x; });
}
Tensor neg(const Tensor& x) { return unary("neg", U::Neg, 0, x, [](auto v) { return -v; }); }
Tensor exp(const Tensor& x) { return unary("exp", U::Exp, 0, x, [](auto v) { return std::exp(v); }); }
Tensor log(const Tensor& x) { return unary("log", U::Log, 0, x, [](auto v) { return std::log(v); }); }
Tensor tanh(const Tensor& x) { return unary("tanh", U::Tanh, 0, x, [](auto v) { return std::tanh(v); }); }
Tensor sqrt(const Tensor& x) { return unary("sqrt", U::Sqrt, 0, x, [](auto v) { return std::sqrt(v); }); }
Tensor pow(const Tensor& x, double p) {
  if (p == 2.0) return unary("pow", U::Square, 0, x, [](auto v) { return v * v; });
  return unary("pow", U::Pow, p, x, [p](auto v) { return std::pow(v, decltype(v)(p)); });
}
Tensor relu(const Tensor& x) {
  return unary("relu", U::Relu, 0, x, [](auto v) { return v > decltype(v)(0) ? v : decltype(v)(0); });
}
// GELU and its backward on the CPU, fp32/fp64, contiguous (the MLP's [B T, 4C]): cpu/gelu_vec.h's runs, which
// linear_gelu's epilogue also runs, so that gelu(linear(x)) and linear_gelu agree in any build.
namespace {
bool gelu_runs(const Tensor& x) {
  return x.device().is_cpu() && (x.dtype() == kFloat32 || x.dtype() == kFloat64) && x.is_contiguous();
}
// n values over the math threads in runs that start at multiples of cpu::kGeluRunStep (the same bits at any
// thread count): run(begin, end).
template <class Run>
void gelu_split(int64_t n, const Run& run) {
  cpu::parallel_chunks(n, cpu::kElementwiseGrain, cpu::kGeluRunStep, run);
}
}  // namespace

Tensor gelu(const Tensor& x) {
  if (gelu_runs(x)) {
    const int64_t n = x.numel();
    profile::Scope prof("gelu", double(n), 2.0 * double(n) * double(element_size(x.dtype())));
    Tensor out = empty(x.shape(), x.dtype());
    LOOM_DISPATCH_COMPUTE(x.dtype(), "gelu", {
      const scalar_t* xp = x.data<scalar_t>();
      scalar_t* o = out.data<scalar_t>();
      gelu_split(n, [&](int64_t b, int64_t e) { cpu::gelu_run(xp + b, o + b, e - b); });
    });
    return out;
  }
  return unary("gelu", U::Gelu, 0, x, [](auto v) { return kernels::gelu(v); });
}
Tensor gelu_backward(const Tensor& grad, const Tensor& x) {
  if (gelu_runs(x) && grad.device().is_cpu() && grad.dtype() == x.dtype() && grad.shape() == x.shape() &&
      grad.is_contiguous()) {
    const int64_t n = x.numel();
    profile::Scope prof("gelu_backward", double(n), 3.0 * double(n) * double(element_size(x.dtype())));
    Tensor out = empty(x.shape(), x.dtype());
    LOOM_DISPATCH_COMPUTE(x.dtype(), "gelu_backward", {
      const scalar_t *g = grad.data<scalar_t>(), *xp = x.data<scalar_t>();
      scalar_t* o = out.data<scalar_t>();
      gelu_split(n, [&](int64_t b, int64_t e) { cpu::gelu_backward_run(g + b, xp + b, o + b, e - b); });
    });
    return out;
  }
  return binary("gelu_backward", B::GeluBackward, grad, x,
                [](auto g, auto v) { return kernels::gelu_backward(g, v); });
}
Tensor silu(const Tensor& x) { return unary("silu", U::Silu, 0, x, [](auto v) { return kernels::silu(v); }); }
Tensor silu_backward(const Tensor& grad, const Tensor& x) {
  return binary("silu_backward", B::SiluBackward, grad, x,
                [](auto g, auto v) { return kernels::silu_backward(g, v); });
}
Tensor gt_scalar(const Tensor& x, double s) {
  return unary("gt", U::Gt, s, x, [s](auto v) { return v > decltype(v)(s) ? decltype(v)(1) : decltype(v)(0); });
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_same_dtype("where", a, b);
  Shape shape = broadcast_shapes("where", broadcast_shapes("where", cond.shape(), a.shape()), b.shape());
  LOOM_CHECK(cond.device() == a.device(), "where: devices differ: condition on ", cond.device().str(), ", values on ",
             a.device().str());
  if (a.device().is_cuda()) return cuda::where(cond, a, b, shape);
  check_device_supported("where", a.device());
  Tensor out = empty(shape, a.dtype(), a.device());
  LOOM_DISPATCH_ALL(cond.dtype(), "where", {
    using C = scalar_t;
    LOOM_DISPATCH_ALL(a.dtype(), "where", {
      cpu::ternary_loop<scalar_t, C, scalar_t, scalar_t>(
          out, cond, a, b, [](C c, scalar_t x, scalar_t y) { return cpu::to_acc(c) != 0 ? x : y; });
    });
  });
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  Tensor v = full({}, value, x.dtype(), x.device());
  return where(mask, v, x);
}

Tensor causal_mask_fill(const Tensor& x, double value) {
  LOOM_CHECK(x.dim() >= 2, "causal_mask_fill: needs [..., T, S], got ", x.shape());
  if (x.device().is_cuda()) {  // where() with a [T, S] mask (column > row) made on the host and copied up
    int64_t T = x.size(-2), S = x.size(-1);
    std::vector<int32_t> m(size_t(T * S));
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < S; ++j) m[size_t(i * S + j)] = j > i;
    return masked_fill(x, to(from_vector(m, {T, S}), x.device()), value);
  }
  check_device_supported("causal_mask_fill", x.device());
  Tensor out = clone(x);
  int64_t T = x.size(-2), S = x.size(-1), batches = x.numel() / std::max<int64_t>(1, T * S);
  LOOM_DISPATCH_FLOAT(x.dtype(), "causal_mask_fill", {
    scalar_t v = cpu::from_acc<scalar_t>(value);
    scalar_t* p = out.data<scalar_t>();
    for (int64_t b = 0; b < batches; ++b)
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = i + 1; j < S; ++j) p[(b * T + i) * S + j] = v;
  });
  return out;
}

void add_(const Tensor& dst, const Tensor& src, double alpha) {
  profile::Scope prof("add_", 2.0 * double(dst.numel()),
                      double(2 * dst.numel() + src.numel()) * double(element_size(dst.dtype())));
  dst.check_inplace("add_");
  check_same_dtype("add_", dst, src);
  LOOM_CHECK(broadcast_shapes("add_", dst.shape(), src.shape()) == dst.shape(), "add_: ", src.shape(),
             " does not broadcast to ", dst.shape());
  if (dst.device().is_cuda()) {
    check_float("add_", dst);
    return cuda::add_(dst, src, alpha);
  }
  check_device_supported("add_", dst.device());
  LOOM_DISPATCH_FLOAT(dst.dtype(), "add_", {
    acc_t al = acc_t(alpha);
    cpu::binary_loop<scalar_t, scalar_t, scalar_t>(dst, dst, src, [al](scalar_t x, scalar_t y) {
      return cpu::from_acc<scalar_t>(acc_t(cpu::to_acc(x)) + al * acc_t(cpu::to_acc(y)));
    });
  });
}

void mul_(const Tensor& dst, double s) {
  profile::Scope prof("mul_", double(dst.numel()), 2.0 * double(dst.numel()) * double(element_size(dst.dtype())));
  dst.check_inplace("mul_");
  if (dst.device().is_cuda()) {
    check_float("mul_", dst);
    return cuda::mul_(dst, s);
  }
  check_device_supported("mul_", dst.device());
  LOOM_DISPATCH_FLOAT(dst.dtype(), "mul_", {
    acc_t f = acc_t(s);
    cpu::unary_loop<scalar_t, scalar_t>(dst, dst, [f](scalar_t x) {
      return cpu::from_acc<scalar_t>(acc_t(cpu::to_acc(x)) * f);
    });
  });
}

}  // namespace loom::ops
