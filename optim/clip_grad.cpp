#include "optim/clip_grad.h"

#include <cmath>
#include <set>

#include "autograd/variable.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::optim {

template <class T>
static double squares(const T* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
  return s;
}

double total_norm(const std::vector<Tensor>& tensors) { return std::sqrt(sum_of_squares(tensors)); }

double sum_of_squares(const std::vector<Tensor>& tensors) {
  double sq = 0;
  for (const Tensor& t : tensors) {
    if (!t.defined()) continue;
    check_device_supported("total_norm", t.device());
    if (t.dtype() == kFloat64) {
      Tensor c = ops::contiguous(t);
      sq += squares(c.data<double>(), c.numel());
    } else {
      // fp32 as is (no copy when contiguous); bf16/fp16 widened to fp32 exactly.
      Tensor c = ops::contiguous(ops::to(t, kFloat32));
      sq += squares(c.data<float>(), c.numel());
    }
  }
  // Model parallel: each rank holds only some of the params, so `sq` is a
  // partial sum there; it is all-reduced (SUM) over the model-parallel group
  // before the sqrt (optim/mixed_precision_optimizer.cpp, parallel/grad_norm.cpp).
  return sq;
}

double clip_grads(const std::vector<Tensor>& grads, double max_norm) {
  LOOM_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be > 0, got ", max_norm);
  double norm = total_norm(grads);
  scale_grads_to_norm(grads, max_norm, norm);
  return norm;
}

void scale_grads_to_norm(const std::vector<Tensor>& grads, double max_norm, double norm) {
  double clip_coef = max_norm / (norm + 1e-6);
  if (clip_coef < 1.0) {  // PyTorch's clamp(clip_coef, max=1): only ever scale down
    NoGradGuard no_grad;
    for (const Tensor& g : grads)
      if (g.defined()) ops::mul_(g, clip_coef);
  }
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  // A param listed twice (a tied weight) must be counted and scaled once.
  std::set<const TensorImpl*> seen;
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (seen.insert(p.impl()).second) grads.push_back(autograd::grad(p));
  return clip_grads(grads, max_norm);
}

}  // namespace loom::optim
