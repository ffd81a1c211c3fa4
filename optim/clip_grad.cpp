#include "optim/clip_grad.h"

#include <cmath>
#include <set>

#include "autograd/variable.h"
#include "parallel/grad_norm.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::optim {

// One implementation of the sum of squares: the multi-rank one, on this rank alone.
double total_norm(const std::vector<Tensor>& tensors) {
  for (const Tensor& t : tensors)
    if (t.defined()) check_device_supported("total_norm", t.device());
  return parallel::global_grad_norm(tensors, nullptr);
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
