// The optimizer math on the GPU: the AdamW element update and the loss-scaling
// unscale + found_inf check, each the LOOM_HOST_DEVICE function from
// tensor/kernels/ that the CPU loops in optim/ call, one thread per element.
// (The grad norm needs no kernel of its own: optim/clip_grad.cpp sums
// squares with ops on the device.) A launch a tensor; under
// LOOM_CUDA_KERNELS=fast, optim/grad_multi_tensor.cpp takes the one-launch
// forms instead (fast/unscale_multi_tensor.cu, fast/grad_norm_multi_tensor.cu).
#include "tensor/cuda/cuda_ops.h"
#include "tensor/cuda/launch.cuh"
#include "tensor/kernels/adamw.h"
#include "tensor/kernels/unscale.h"

namespace loom::cuda {
namespace {

// P: the param's storage type; T: the compute type of the moments and gradient.
template <class P, class T>
__global__ void adamw_kernel(P* p, T* m, T* v, const T* g, int64_t n, kernels::AdamWScalars<T> s) {
  LOOM_GRID_STRIDE_LOOP(i, n) {
    T x = T(to_compute(p[i]));
    kernels::adamw_update(x, m[i], v[i], g[i], s);
    p[i] = from_compute<P>(x);
  }
}

// g <- g * inv_scale; *found_inf = 1 when any element was inf or nan (every
// writer writes the same 1, so the order of the writes does not matter).
__global__ void unscale_kernel(float* g, int64_t n, float inv_scale, int32_t* found_inf) {
  LOOM_GRID_STRIDE_LOOP(i, n) {
    if (kernels::unscale_and_check(g[i], inv_scale)) *found_inf = 1;
  }
}

template <class T>
void check_state(const Tensor& p, const Tensor& m, const Tensor& v, const Tensor& g) {
  for (const Tensor* t : {&p, &m, &v, &g})
    LOOM_CHECK(t->device() == p.device() && t->is_contiguous() && t->numel() == p.numel(), "AdamW: param ",
               p.describe(), " on ", p.device().str(), ": state/gradient ", t->describe(), " on ", t->device().str(),
               " must be contiguous, of its size, on its device");
  for (const Tensor* t : {&m, &v, &g})
    LOOM_CHECK(t->dtype() == dtype_of<T>(), "AdamW: expected ", dtype_name(dtype_of<T>()), " state, got ",
               t->describe());
}

template <class P, class T>
void launch_adamw(const Tensor& p, const Tensor& m, const Tensor& v, const Tensor& g,
                  const kernels::AdamWScalars<T>& s) {
  const int64_t n = p.numel();
  LaunchConfig c = launch_config(n);
  adamw_kernel<P, T><<<c.blocks, c.threads, 0, stream(p.device())>>>(ptr<P>(p), ptr<T>(m), ptr<T>(v), ptr<T>(g), n, s);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void adamw_update(const Tensor& p, const Tensor& m, const Tensor& v, const Tensor& g,
                  const kernels::AdamWScalars<float>& s) {
  check_state<float>(p, m, v, g);
  if (p.numel() == 0) return;
  DeviceGuard guard(p.device());
  switch (p.dtype()) {
    case DType::Float32: return launch_adamw<float, float>(p, m, v, g, s);
    case DType::BFloat16: return launch_adamw<bfloat16, float>(p, m, v, g, s);
    case DType::Float16: return launch_adamw<float16, float>(p, m, v, g, s);
    default: throw Error(str("AdamW: param ", p.describe(), " with fp32 state: unsupported dtype"));
  }
}

void adamw_update(const Tensor& p, const Tensor& m, const Tensor& v, const Tensor& g,
                  const kernels::AdamWScalars<double>& s) {
  check_state<double>(p, m, v, g);
  LOOM_CHECK(p.dtype() == kFloat64, "AdamW: param ", p.describe(), " with float64 state");
  if (p.numel() == 0) return;
  DeviceGuard guard(p.device());
  launch_adamw<double, double>(p, m, v, g, s);
}

bool unscale_(const std::vector<Tensor>& grads, double inv_scale) {
  if (grads.empty()) return false;
  const Device d = grads.front().device();
  Tensor found_inf = zeros({}, kInt32, d);  // one flag for all the grads: one wait, at the end
  DeviceGuard guard(d);
  for (const Tensor& g : grads) {
    LOOM_CHECK(g.device() == d && g.dtype() == kFloat32 && g.is_contiguous(), "unscale_: gradients must be "
               "contiguous fp32 (main grads) on one device, got ", g.describe(), " on ", g.device().str());
    if (g.numel() == 0) continue;
    LaunchConfig c = launch_config(g.numel());
    unscale_kernel<<<c.blocks, c.threads, 0, stream(d)>>>(ptr<float>(g), g.numel(), float(inv_scale),
                                                          ptr<int32_t>(found_inf));
    CUDA_CHECK_LAUNCH();
  }
  return found_inf.item<int64_t>() != 0;  // the step is skipped or taken on the host: it must wait here
}

}  // namespace loom::cuda
