// grad_multi_tensor.h: the one-launch path where it applies, the per-tensor ops otherwise.
#include "optim/grad_multi_tensor.h"

#include "tensor/cuda/fast/grad_norm_multi_tensor.h"
#include "tensor/cuda/fast/unscale_multi_tensor.h"
#include "tensor/cuda/kernel_choice.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::optim {

OneLaunchSplit split_for_one_launch(const std::vector<Tensor>& grads) {
  OneLaunchSplit out;
  const bool fast = cuda::fast_kernels();
  const Tensor* first = nullptr;  // the first grad that fits: its device is the launch's
  for (const Tensor& g : grads) {
    if (!g.defined()) continue;
    const bool fits = fast && g.device().is_cuda() && g.dtype() == kFloat32 && g.is_contiguous() &&
                      (!first || g.device() == first->device());
    if (fits && !first) first = &g;
    (fits ? out.together : out.rest).push_back(g);
  }
  return out;
}

bool unscale_grads(const std::vector<Tensor>& grads, double inv_scale) {
  const OneLaunchSplit s = split_for_one_launch(grads);
  bool found_inf = !s.together.empty() && cuda::unscale_multi_tensor(s.together, inv_scale);
  if (!s.rest.empty()) found_inf = ops::unscale_(s.rest, inv_scale) || found_inf;  // every grad unscaled either way
  return found_inf;
}

double grads_sum_of_squares(const std::vector<Tensor>& grads) {
  const OneLaunchSplit s = split_for_one_launch(grads);
  double total = s.rest.empty() ? 0.0 : ops::sum_of_squares(s.rest);
  if (!s.together.empty()) total += cuda::sum_of_squares_multi_tensor(s.together);
  return total;
}

void scale_grads(const std::vector<Tensor>& grads, double factor) {
  NoGradGuard no_grad;
  const OneLaunchSplit s = split_for_one_launch(grads);
  if (!s.together.empty()) cuda::scale_multi_tensor(s.together, factor);
  for (const Tensor& g : s.rest) ops::mul_(g, factor);
}

}  // namespace loom::optim
