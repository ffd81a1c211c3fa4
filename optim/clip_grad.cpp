#include "optim/clip_grad.h"

#include <cmath>
#include <unordered_set>

#include "autograd/variable.h"
#include "optim/grad_multi_tensor.h"

namespace loom::optim {

namespace {

// The gradients of each param once (a tied weight may be listed twice on one
// rank), leaving out those in `skip`.
std::vector<Tensor> unique_grads(const std::vector<Tensor>& params, const std::vector<Tensor>& skip = {}) {
  std::unordered_set<const TensorImpl*> seen;
  for (const Tensor& p : skip) seen.insert(p.impl());
  std::vector<Tensor> out;
  for (const Tensor& p : params)
    if (seen.insert(p.impl()).second) out.push_back(autograd::grad(p));
  return out;
}

}  // namespace

double global_grad_norm(const std::vector<Tensor>& grads, parallel::ProcessGroup* group) {
  // In double, on the grads' device: one reduction for all under LOOM_CUDA_KERNELS=fast (grad_multi_tensor.h).
  const double local = grads_sum_of_squares(grads);
  if (!group) return std::sqrt(local);
  // The partial sums of squares add up to the whole model's (not the norms: |a|+|b| != |(a, b)|).
  Tensor total = full({}, local, kFloat64);
  group->all_reduce(total, parallel::ReduceOp::Sum);
  return std::sqrt(total.item<double>());
}

void scale_grads_to_norm(const std::vector<Tensor>& grads, double max_norm, double norm) {
  double clip_coef = max_norm / (norm + 1e-6);
  // PyTorch's clamp(clip_coef, max=1): only ever scale down. Undefined grads are skipped; one launch for
  // all under LOOM_CUDA_KERNELS=fast on a GPU (grad_multi_tensor.h), ops::mul_'s bits either way.
  if (clip_coef < 1.0) scale_grads(grads, clip_coef);
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, parallel::ProcessGroup* group,
                      const std::vector<Tensor>& not_counted) {
  LOOM_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be > 0, got ", max_norm);
  const double norm = global_grad_norm(unique_grads(params, not_counted), group);
  scale_grads_to_norm(unique_grads(params), max_norm, norm);
  return norm;
}

}  // namespace loom::optim
