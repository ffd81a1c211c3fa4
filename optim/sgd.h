// SGD with momentum and Nesterov momentum, exactly torch.optim.SGD (dampening 0):
//   d = g + wd * p                       (L2 weight decay, added to the gradient)
//   buf = momentum * buf + d             (momentum > 0; buf starts at 0, so step 1 gives buf = d)
//   d = nesterov ? d + momentum * buf : buf
//   p = p - lr * d
// lr and weight_decay are per param group; momentum and nesterov are global.
#pragma once

#include "optim/optimizer.h"

namespace loom::optim {

struct SGDOptions {
  double momentum = 0.0;
  bool nesterov = false;  // needs momentum > 0
};

class SGD : public Optimizer {
 public:
  explicit SGD(std::vector<ParamGroup> groups, SGDOptions options = {});
  void step() override;

  const SGDOptions& options() const { return options_; }
  // The momentum buffer of param `index` of group `group` (undefined when momentum is 0).
  const Tensor& momentum_buffer(size_t group, size_t index) const { return momentum_buffer_.at(group).at(index); }

 protected:
  NamedTensors param_state(size_t group, size_t index) const override;

 private:
  SGDOptions options_;
  std::vector<std::vector<Tensor>> momentum_buffer_;  // [group][param], same shape and dtype as the param
};

}  // namespace loom::optim
