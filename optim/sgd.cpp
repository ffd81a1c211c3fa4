#include "optim/sgd.h"

#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::optim {

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions options)
    : Optimizer(std::move(groups)), options_(options) {
  LOOM_CHECK(options_.momentum >= 0, "SGD: momentum must be >= 0, got ", options_.momentum);
  LOOM_CHECK(!options_.nesterov || options_.momentum > 0, "SGD: nesterov momentum needs momentum > 0");
  for (const ParamGroup& group : groups_) {
    std::vector<Tensor>& bufs = momentum_buffer_.emplace_back();
    for (const Tensor& p : group.params)
      bufs.push_back(options_.momentum > 0 ? zeros(p.shape(), p.dtype(), p.device()) : Tensor());
  }
}

void SGD::step() {
  NoGradGuard no_grad;
  const double momentum = options_.momentum;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    LOOM_CHECK(group.params.size() == momentum_buffer_[g].size(), "SGD::step: group ", g, " has ",
               group.params.size(), " params but the optimizer was built with ", momentum_buffer_[g].size());
    for (size_t i = 0; i < group.params.size(); ++i) {
      const Tensor& p = group.params[i];
      Tensor grad = grad_of(p);
      if (!grad.defined()) continue;
      LOOM_CHECK(grad.shape() == p.shape(), "SGD::step: ", describe_param(g, i), " has a gradient of shape ",
                 grad.shape());
      Tensor d = ops::to(grad, p.dtype());
      if (group.weight_decay != 0) d = ops::add(d, ops::mul(p, group.weight_decay));
      if (momentum > 0) {
        const Tensor& buf = momentum_buffer_[g][i];
        ops::mul_(buf, momentum);
        ops::add_(buf, d);
        d = options_.nesterov ? ops::add(d, ops::mul(buf, momentum)) : buf;
      }
      ops::add_(p, d, -group.lr);
    }
  }
}

NamedTensors SGD::param_state(size_t group, size_t index) const {
  if (options_.momentum == 0) return {};
  return {{"momentum_buffer", momentum_buffer_[group][index]}};
}

}  // namespace loom::optim
