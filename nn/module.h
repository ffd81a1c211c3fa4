// Module: a named tree of parameters and child modules (PyTorch's nn.Module).
// Layer: a Module with one Tensor -> Tensor forward, the unit a pipeline stage
// is cut from. ModuleList: children named "0", "1", ... (nn.ModuleList).
//
// Parameter order is deterministic, and it is a contract: it defines the layout
// of data-parallel gradient buckets (built in reverse parameter order) and of
// checkpoints (tensors are written in this order). The rule, as in PyTorch:
//   named_parameters() = a module's own parameters in registration order, then
//   each child's named_parameters() in registration order (depth-first),
//   names joined with dots ("blocks.3.attn.c_attn.weight").
// A tensor reachable under two names (a tied embedding) is listed once, under
// the name met first. state_dict() has the same entries in the same order.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "autograd/hooks.h"
#include "tensor/tensor.h"

namespace loom {
struct PhiloxGenerator;  // tensor/generator.h
}

namespace loom::nn {

struct MoE;  // nn/moe.h

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module : public std::enable_shared_from_this<Module> {
 public:
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  virtual ~Module() = default;

  // Adds t as a parameter of this module and marks it requires_grad; returns t.
  // Names are unique within a module and contain no '.'.
  Tensor register_parameter(const std::string& name, Tensor t);

  // Adds m as a child module; returns m (so `fc = register_module("fc", make_shared<Linear>(...))`).
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    static_assert(std::is_base_of_v<Module, M>, "register_module: M must derive from loom::nn::Module");
    add_child(name, m);
    return m;
  }

  // Puts m where the child `name` was (its place in the order kept): how a
  // head comes to share an embedding built apart from it (parallel/model_chunks.h).
  void replace_module(const std::string& name, std::shared_ptr<Module> m);

  // Every parameter of the tree, each tensor once, in the documented order.
  NamedTensors named_parameters() const;
  std::vector<Tensor> parameters() const;
  int64_t num_parameters() const;  // total elements over parameters()
  // This module's own parameters and direct children, in registration order.
  const NamedTensors& named_own_parameters() const { return params_; }
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const { return children_; }
  // This module as a mixture-of-experts layer, or null: how moe_layers (nn/moe.h) finds them without a cast.
  virtual MoE* as_moe() { return nullptr; }

  // fn(module, input) runs before each call of this module's forward (PyTorch's
  // register_forward_pre_hook), while the returned handle lives. Where a module
  // must wait for something its forward reads: ZeRO's overlapped param
  // all-gather (optim/param_gather_overlap.h) waits there for its bucket.
  using ForwardPreHook = std::function<void(Module& module, const Tensor& input)>;
  autograd::RemovableHandle register_forward_pre_hook(ForwardPreHook fn);
  void run_forward_pre_hooks(const Tensor& input) { forward_pre_hooks_->run(*this, input); }
  // fn(module, input, output) runs after each call of forward (PyTorch's
  // register_forward_hook) and may replace output. ZeRO-3 frees the unit's
  // gathered params there and wraps the output in the function whose backward
  // gathers them again (parallel/data_parallel/fully_sharded.h).
  using ForwardHook = std::function<void(Module& module, const Tensor& input, Tensor& output)>;
  autograd::RemovableHandle register_forward_hook(ForwardHook fn);
  void run_forward_hooks(const Tensor& input, Tensor& output) { forward_hooks_->run(*this, input, output); }

  // Training mode (dropout active) for this module and every descendant.
  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // The generator this module's own forward draws from (Dropout's masks); null
  // for a deterministic one. A checkpoint saves its offset, and a recomputed
  // region replays it (nn/dropout.h: dropout_generators).
  virtual PhiloxGenerator* generator() { return nullptr; }

  // Casts every floating parameter to dtype in place (PyTorch's
  // module.to(torch.bfloat16)): the tensors keep their identity - a tied weight
  // stays one tensor, hooks and optimizers holding them see the new dtype - and
  // values are rounded to nearest even. Call before training starts.
  void to(DType dtype);
  // Moves every parameter to device in place (module.to("cuda")), the same
  // way: identity kept, so a model built on the CPU by the seeded generators
  // reaches the GPU with the CPU run's weights. Call before the optimizer
  // makes its state beside them.
  void to(const Device& device);

  // The parameters as (name, tensor) outside the autograd graph; the tensors
  // share storage with the parameters (clone them for a snapshot).
  NamedTensors state_dict() const;

  // Copies values into the parameters (dtype converted). Every problem is
  // collected and reported in one loom::Error before anything is copied:
  // mis-shaped entries (name and both shapes) always, missing and unexpected
  // names when strict. Non-strict loads the entries that match and returns
  // the names it skipped.
  struct LoadResult {
    std::vector<std::string> missing_keys, unexpected_keys;
  };
  LoadResult load_state_dict(const NamedTensors& state, bool strict = true);

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  void check_new_name(const std::string& name, const char* what) const;
  void collect(const std::string& prefix, NamedTensors& out, std::vector<const TensorImpl*>& seen) const;

  NamedTensors params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::shared_ptr<autograd::HookListOf<Module&, const Tensor&>> forward_pre_hooks_ =
      std::make_shared<autograd::HookListOf<Module&, const Tensor&>>();
  std::shared_ptr<autograd::HookListOf<Module&, const Tensor&, Tensor&>> forward_hooks_ =
      std::make_shared<autograd::HookListOf<Module&, const Tensor&, Tensor&>>();
  bool training_ = true;
};

// One Tensor -> Tensor step of a model. A GPT is the list
// [embedding, block_0 ... block_{L-1}, head] of Layers (nn/gpt.h), so a
// pipeline stage is just a contiguous slice of that list.
// Calling a layer, layer(x), runs its forward pre-hooks, forward(x), then its
// forward hooks (PyTorch's Module.__call__); forward(x) alone runs no hook.
struct Layer : Module {
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) {
    run_forward_pre_hooks(x);
    Tensor y = forward(x);
    run_forward_hooks(x, y);
    return y;
  }
};

// Children registered under their index: "0", "1", ... (PyTorch's nn.ModuleList).
template <class M = Module>
class ModuleList : public Module {
 public:
  void push_back(std::shared_ptr<M> m) { items_.push_back(register_module(std::to_string(items_.size()), std::move(m))); }
  size_t size() const { return items_.size(); }
  const std::shared_ptr<M>& operator[](size_t i) const { return items_.at(i); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  std::vector<std::shared_ptr<M>> items_;
};

}  // namespace loom::nn
