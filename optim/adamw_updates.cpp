// adamw_updates (adamw_updates.h): the one-launch path where it applies, adamw_update otherwise.
#include "optim/adamw_updates.h"

#include "tensor/cuda/fast/adamw_multi_tensor.h"
#include "tensor/cuda/kernel_choice.h"

namespace loom::optim {

void adamw_updates(const std::vector<AdamWUpdate>& updates, const AdamWOptions& o) {
  // The one launch takes the params of the first GPU param's device and dtype; the rest go one by one.
  const AdamWUpdate* first = nullptr;
  if (cuda::fast_kernels())
    for (const AdamWUpdate& u : updates)
      if (u.param.device().is_cuda() && u.param.dtype() != kFloat64 && u.param.is_contiguous()) {
        first = &u;
        break;
      }
  std::vector<Tensor> p, m, v, g;
  std::vector<kernels::AdamWScalars<float>> s;
  for (const AdamWUpdate& u : updates) {
    const bool together = first && u.param.device() == first->param.device() &&
                          u.param.dtype() == first->param.dtype() && u.param.is_contiguous();
    if (!together) {
      adamw_update(u.param, *u.state, u.grad, u.lr, u.weight_decay, o);
      continue;
    }
    const int64_t step = ++u.state->step.data<int64_t>()[0];  // as adamw_update counts it
    p.push_back(u.param);
    m.push_back(u.state->exp_avg);
    v.push_back(u.state->exp_avg_sq);
    g.push_back(u.grad);
    s.push_back(kernels::adamw_scalars<float>(u.lr, o.beta1, o.beta2, o.eps, u.weight_decay, step));
  }
  if (!p.empty()) cuda::adamw_multi_tensor(p, m, v, g, s);
}

}  // namespace loom::optim
