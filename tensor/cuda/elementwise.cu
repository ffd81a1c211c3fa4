// Elementwise math on the GPU: the unary ops (and their scalar forms) and the
// broadcasting binary ops of ops_elementwise.cpp. One kernel per storage dtype
// for each kind, with the op a runtime switch (the same on every thread, so it
// costs no divergence): a kernel per (op, dtype) would multiply the compile
// time for no measurable gain in a memory-bound loop.
//
// The math is the CPU's: compute type float (double for float64), GELU from
// tensor/kernels/gelu.h; bf16/fp16 convert in and round out per element.
#include <cmath>

#include "tensor/cpu/dispatch.h"
#include "tensor/cuda/cuda_ops.h"
#include "tensor/cuda/launch.cuh"
#include "tensor/kernels/gelu.h"
#include "tensor/kernels/silu.h"

namespace loom::cuda {
namespace {

template <class A>
__device__ __forceinline__ A apply(Unary op, A x, A s) {
  switch (op) {
    case Unary::AddScalar: return x + s;
    case Unary::MulScalar: return x * s;
    case Unary::RSub: return s - x;
    case Unary::RDiv: return s / x;
    case Unary::Neg: return -x;
    case Unary::Exp: return std::exp(x);
    case Unary::Log: return std::log(x);
    case Unary::Tanh: return std::tanh(x);
    case Unary::Sqrt: return std::sqrt(x);
    case Unary::Pow: return std::pow(x, s);
    case Unary::Square: return x * x;
    case Unary::Relu: return x > A(0) ? x : A(0);
    case Unary::Gelu: return kernels::gelu(x);
    case Unary::Gt: return x > s ? A(1) : A(0);
    case Unary::Silu: return kernels::silu(x);
  }
  return x;
}

template <class A>
__device__ __forceinline__ A apply(Binary op, A x, A y) {
  switch (op) {
    case Binary::Add: return x + y;
    case Binary::Sub: return x - y;
    case Binary::Mul: return x * y;
    case Binary::Div: return x / y;
    case Binary::GeluBackward: return kernels::gelu_backward(x, y);  // x: incoming grad, y: input
    case Binary::SiluBackward: return kernels::silu_backward(x, y);
  }
  return x;
}

// out = op(x, s); out and x may be the same tensor (mul_).
template <class T>
__global__ void unary_kernel(Unary op, double s, T* out, const T* x, Offsets<2> ix, int64_t n) {
  using A = compute_t<T>;
  LOOM_GRID_STRIDE_LOOP(i, n) {
    int64_t o[2];
    ix.get(i, o);
    out[o[0]] = from_compute<T>(apply<A>(op, to_compute(x[o[1]]), A(s)));
  }
}

// out = op(a, b), broadcast through the strides.
template <class T>
__global__ void binary_kernel(Binary op, T* out, const T* a, const T* b, Offsets<3> ix, int64_t n) {
  using A = compute_t<T>;
  LOOM_GRID_STRIDE_LOOP(i, n) {
    int64_t o[3];
    ix.get(i, o);
    out[o[0]] = from_compute<T>(apply<A>(op, to_compute(a[o[1]]), to_compute(b[o[2]])));
  }
}

// dst += alpha * src (src broadcast): the optimizer's and gradient accumulation's in-place add.
template <class T>
__global__ void add_scaled_kernel(T* dst, const T* src, double alpha, Offsets<2> ix, int64_t n) {
  using A = compute_t<T>;
  LOOM_GRID_STRIDE_LOOP(i, n) {
    int64_t o[2];
    ix.get(i, o);
    dst[o[0]] = from_compute<T>(to_compute(dst[o[0]]) + A(alpha) * to_compute(src[o[1]]));
  }
}

void unary_into(Unary op, const Tensor& out, const Tensor& x, double s) {
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceGuard guard(x.device());
  auto ix = make_offsets<2>("unary op", out.shape(), {out.strides(), broadcast_strides(x, out.shape())});
  LaunchConfig c = launch_config(n);
  cudaStream_t st = stream(x.device());
  LOOM_DISPATCH_FLOAT(x.dtype(), "unary op", {
    unary_kernel<scalar_t><<<c.blocks, c.threads, 0, st>>>(op, s, ptr<scalar_t>(out), ptr<scalar_t>(x), ix, n);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace

Tensor unary(Unary op, const Tensor& x, double s) {
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  unary_into(op, out, x, s);
  return out;
}

void mul_(const Tensor& dst, double s) { unary_into(Unary::MulScalar, dst, dst, s); }

Tensor binary(Binary op, const Tensor& a, const Tensor& b) {
  Tensor out = empty(ops::broadcast_shapes("binary op", a.shape(), b.shape()), a.dtype(), a.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  DeviceGuard guard(a.device());
  auto ix = make_offsets<3>("binary op", out.shape(),
                            {out.strides(), broadcast_strides(a, out.shape()), broadcast_strides(b, out.shape())});
  LaunchConfig c = launch_config(n);
  cudaStream_t st = stream(a.device());
  LOOM_DISPATCH_FLOAT(a.dtype(), "binary op", {
    binary_kernel<scalar_t><<<c.blocks, c.threads, 0, st>>>(op, ptr<scalar_t>(out), ptr<scalar_t>(a),
                                                             ptr<scalar_t>(b), ix, n);
  });
  CUDA_CHECK_LAUNCH();
  return out;
}

void add_(const Tensor& dst, const Tensor& src, double alpha) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  DeviceGuard guard(dst.device());
  auto ix = make_offsets<2>("add_", dst.shape(), {dst.strides(), broadcast_strides(src, dst.shape())});
  LaunchConfig c = launch_config(n);
  cudaStream_t st = stream(dst.device());
  LOOM_DISPATCH_FLOAT(dst.dtype(), "add_", {
    add_scaled_kernel<scalar_t><<<c.blocks, c.threads, 0, st>>>(ptr<scalar_t>(dst), ptr<scalar_t>(src), alpha, ix,
                                                                 n);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace loom::cuda
