// The optimizer's element math over whole tensors, on the tensors' device: the
// fused AdamW loop (tensor/kernels/adamw.h), fp16 loss scaling's unscale and
// inf check (tensor/kernels/unscale.h), and the gradient norm's sum of
// squares. optim/ calls these and never a device's own kernels; the CUDA
// versions (tensor/cuda/optim.cu) run the same element functions.
#include <type_traits>

#include "tensor/cuda/cuda_ops.h"
#include "tensor/kernels/unscale.h"
#include "tensor/profile.h"
#include "tensor/ops.h"
#include "tensor/parallel.h"

namespace loom::ops {

namespace {

// Storage <-> compute conversions for the param (bf16/fp16 round to nearest even).
template <class T> T load(float x) { return T(x); }
template <class T> T load(double x) { return T(x); }
template <class T> T load(bfloat16 x) { return T(bf16_to_float(x)); }
template <class T> T load(float16 x) { return T(fp16_to_float(x)); }
template <class P, class T> P store(T x) {
  if constexpr (std::is_same_v<P, bfloat16>) return float_to_bf16(float(x));
  else if constexpr (std::is_same_v<P, float16>) return float_to_fp16(float(x));
  else return P(x);
}

// The fused loop over elements [b, e) of one param. P is the param's storage
// type, T the compute type of the moments and the gradient.
template <class P, class T>
void adamw_chunk(P* __restrict p, T* __restrict m, T* __restrict v, const T* __restrict g, int64_t b, int64_t e,
                 const kernels::AdamWScalars<T>& scalars) {
  const kernels::AdamWScalars<T> s = scalars;  // a local copy: the stores below cannot alias it
  for (int64_t i = b; i < e; ++i) {
    T x = load<T>(p[i]);
    kernels::adamw_update(x, m[i], v[i], g[i], s);
    p[i] = store<P>(x);
  }
}

// All n elements, split over the math threads: each element's update reads
// and writes only its own p, m, v, so the bits are the same at any thread
// count. (One thread below ~32k elements: the biases and layernorm params.)
template <class P, class T>
void adamw_loop(const Tensor& p, const Tensor& m, const Tensor& v, const Tensor& g,
                const kernels::AdamWScalars<T>& s) {
  P* pp = p.data<P>();
  T *mp = m.data<T>(), *vp = v.data<T>();
  const T* gp = g.data<T>();
  parallel_for(p.numel(), int64_t(1) << 15, [&](int64_t b, int64_t e) { adamw_chunk<P, T>(pp, mp, vp, gp, b, e, s); });
}

void check_adamw(const Tensor& p, const Tensor& m, const Tensor& v, const Tensor& g, DType compute) {
  for (const Tensor* t : {&p, &m, &v, &g})
    LOOM_CHECK(t->is_contiguous() && t->numel() == p.numel() && t->device() == p.device(), "adamw_: param ",
               p.describe(), ", exp_avg ", m.describe(), ", exp_avg_sq ", v.describe(), ", grad ", g.describe(),
               ": all contiguous, of one size, on one device");
  LOOM_CHECK(m.dtype() == compute && v.dtype() == compute && g.dtype() == compute, "adamw_: the moments and the "
             "gradient of ", p.describe(), " must be ", dtype_name(compute), ", got ", m.describe(), ", ",
             v.describe(), ", ", g.describe());
}

}  // namespace

void adamw_(const Tensor& p, const Tensor& m, const Tensor& v, const Tensor& g, const kernels::AdamWScalars<float>& s) {
  // p, m, v read and written, g read: 7 tensors' worth of bytes; ~15 flops an element
  profile::Scope prof("adamw", 15.0 * double(p.numel()), 7.0 * double(p.numel()) * double(element_size(m.dtype())));
  check_adamw(p, m, v, g, kFloat32);
  if (p.device().is_cuda()) return cuda::adamw_update(p, m, v, g, s);  // the same element math
  check_device_supported("adamw_", p.device());
  switch (p.dtype()) {
    case DType::Float32: return adamw_loop<float, float>(p, m, v, g, s);
    case DType::BFloat16: return adamw_loop<bfloat16, float>(p, m, v, g, s);
    case DType::Float16: return adamw_loop<float16, float>(p, m, v, g, s);
    default: throw Error(str("adamw_: ", p.describe(), ": params are fp32, bf16 or fp16 with fp32 moments"));
  }
}

void adamw_(const Tensor& p, const Tensor& m, const Tensor& v, const Tensor& g, const kernels::AdamWScalars<double>& s) {
  // p, m, v read and written, g read: 7 tensors' worth of bytes; ~15 flops an element
  profile::Scope prof("adamw", 15.0 * double(p.numel()), 7.0 * double(p.numel()) * double(element_size(m.dtype())));
  check_adamw(p, m, v, g, kFloat64);
  LOOM_CHECK(p.dtype() == kFloat64, "adamw_: ", p.describe(), ": double moments are for float64 params");
  if (p.device().is_cuda()) return cuda::adamw_update(p, m, v, g, s);
  check_device_supported("adamw_", p.device());
  adamw_loop<double, double>(p, m, v, g, s);
}

bool unscale_(const std::vector<Tensor>& grads, double inv_scale) {
  if (!grads.empty() && grads.front().device().is_cuda()) return cuda::unscale_(grads, inv_scale);
  const float inv = float(inv_scale);
  bool found_inf = false;
  for (const Tensor& g : grads) {
    LOOM_CHECK(g.dtype() == kFloat32 && g.is_contiguous(), "unscale_: gradients must be contiguous fp32 (main "
               "grads), got ", g.describe());
    check_device_supported("unscale_", g.device());
    float* x = g.data<float>();
    bool bad = false;
    for (int64_t i = 0, n = g.numel(); i < n; ++i) bad |= kernels::unscale_and_check(x[i], inv);
    found_inf |= bad;
  }
  return found_inf;
}

double sum_of_squares(const std::vector<Tensor>& tensors) {
  double local = 0;
  Tensor on_gpu;  // GPU tensors: squares summed in double on the device, read once at the end
  for (const Tensor& g : tensors) {
    if (!g.defined()) continue;
    if (g.device().is_cuda()) {
      Tensor d = to(g, kFloat64);
      Tensor s = sum(mul(d, d));
      on_gpu = on_gpu.defined() ? add(on_gpu, s) : s;
      continue;
    }
    check_device_supported("sum_of_squares", g.device());
    // Each tensor's sum in double (fp32 as is, other floating dtypes widened), then added.
    Tensor c = contiguous(g.dtype() == kFloat64 ? g : to(g, kFloat32));
    double s = 0;
    if (c.dtype() == kFloat64) {
      const double* x = c.data<double>();
      for (int64_t i = 0; i < c.numel(); ++i) s += x[i] * x[i];
    } else {
      const float* x = c.data<float>();
      for (int64_t i = 0; i < c.numel(); ++i) s += double(x[i]) * double(x[i]);
    }
    local += s;
  }
  if (on_gpu.defined()) local += on_gpu.item<double>();
  return local;
}

}  // namespace loom::ops
