// Optimizer: the base class of SGD and AdamW (torch.optim.Optimizer's shape).
// Params come in groups, each with its own lr and weight decay (the GPT puts
// biases, LayerNorm weights and embeddings in a no-decay group, as nanoGPT
// does); step() reads each param's gradient and updates the param in place.
//
// Per-param state (AdamW's exp_avg, SGD's momentum_buffer...) is created when
// the optimizer is constructed and is named by group and param index in the
// state dict: "state.<group>.<param>.<name>", e.g. "state.0.3.exp_avg".
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace loom::optim {

struct ParamGroup {
  std::vector<Tensor> params = {};
  double lr = 1e-3;
  double weight_decay = 0.0;
  std::string name = {};  // for messages and logs ("decay", "no_decay")
};

// Named tensors, in a stable order: what state_dict() returns and a
// checkpoint stores.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Optimizer {
 public:
  explicit Optimizer(std::vector<ParamGroup> groups);
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every param that has a gradient (params without one are
  // skipped, as in PyTorch). Runs under NoGradGuard.
  virtual void step() = 0;

  // Drops (default) or zeroes the autograd gradient of every param.
  void zero_grad(bool set_to_none = true);

  // Change lr / weight_decay here (an LR schedule does, every step). The
  // params themselves must not be added or removed: the state is indexed by
  // their position.
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  void set_lr(double lr);  // every group

  // The gradient step() uses for p. Default: autograd::grad(p). The
  // data-parallel wrappers point it at the fp32 main_grad buffer that their
  // hooks accumulate into (Megatron's param.main_grad).
  using GradSource = std::function<Tensor(const Tensor& param)>;
  void set_grad_source(GradSource source) { grad_source_ = std::move(source); }
  virtual Tensor grad_of(const Tensor& param) const;

  // Every state tensor, named "state.<group>.<param>.<name>". The entries
  // share storage with the live state (no copy, as in PyTorch): write them out
  // or clone them before the next step().
  virtual NamedTensors state_dict() const;
  // Copies a state dict into the live state. Every entry must be present with
  // the right shape and dtype and nothing else may be there; otherwise throws
  // (naming the entry and the shapes) before anything is changed.
  virtual void load_state_dict(const NamedTensors& state);

 protected:
  // The state of param `index` of group `group`, as (name, tensor) pairs that
  // share storage with the optimizer's own buffers. Empty for stateless
  // optimizers.
  virtual NamedTensors param_state(size_t group, size_t index) const = 0;

  // "group 0 ('decay') param 3 [64, 128]": for error messages.
  std::string describe_param(size_t group, size_t index) const;

  std::vector<ParamGroup> groups_;

 private:
  GradSource grad_source_;
};

}  // namespace loom::optim
