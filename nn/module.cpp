#include "nn/module.h"

#include <algorithm>
#include <map>

#include "autograd/variable.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::nn {

void Module::check_new_name(const std::string& name, const char* what) const {
  LOOM_CHECK(!name.empty() && name.find('.') == std::string::npos, what, ": invalid name '", name,
             "' (must be non-empty and contain no '.')");
  bool taken = std::any_of(params_.begin(), params_.end(), [&](const auto& p) { return p.first == name; }) ||
               std::any_of(children_.begin(), children_.end(), [&](const auto& c) { return c.first == name; });
  LOOM_CHECK(!taken, what, ": name '", name, "' is already registered in this module");
}

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  check_new_name(name, "register_parameter");
  LOOM_CHECK(t.defined(), "register_parameter: '", name, "' is an undefined tensor");
  autograd::set_requires_grad(t, true);
  params_.emplace_back(name, t);
  return t;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_new_name(name, "register_module");
  LOOM_CHECK(m != nullptr, "register_module: '", name, "' is null");
  children_.emplace_back(name, std::move(m));
}

void Module::replace_module(const std::string& name, std::shared_ptr<Module> m) {
  LOOM_CHECK(m != nullptr, "replace_module: '", name, "' is null");
  for (auto& [n, child] : children_)
    if (n == name) {
      child = std::move(m);
      return;
    }
  throw Error(str("replace_module: no child '", name, "' to replace"));
}

// Depth-first: own parameters, then children, skipping tensors already seen
// (a tied weight keeps the first name it was reached under).
void Module::collect(const std::string& prefix, NamedTensors& out, std::vector<const TensorImpl*>& seen) const {
  for (const auto& [name, t] : params_) {
    if (std::find(seen.begin(), seen.end(), t.impl()) != seen.end()) continue;
    seen.push_back(t.impl());
    out.emplace_back(prefix + name, t);
  }
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out, seen);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  std::vector<const TensorImpl*> seen;
  collect("", out, seen);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

autograd::RemovableHandle Module::register_forward_pre_hook(ForwardPreHook fn) {
  return autograd::RemovableHandle(forward_pre_hooks_, forward_pre_hooks_->add(std::move(fn)));
}

autograd::RemovableHandle Module::register_forward_hook(ForwardHook fn) {
  return autograd::RemovableHandle(forward_hooks_, forward_hooks_->add(std::move(fn)));
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::to(DType dtype) {
  LOOM_CHECK(is_floating(dtype), "Module::to: ", dtype_name(dtype), " is not a floating dtype");
  for (auto& [name, p] : named_parameters())
    if (is_floating(p.dtype()) && p.dtype() != dtype) ops::set_data(p, ops::to(autograd::detach(p), dtype));
}

void Module::to(const Device& device) {
  for (auto& [name, p] : named_parameters())
    if (p.device() != device) ops::set_data(p, ops::to(autograd::detach(p), device));
}

NamedTensors Module::state_dict() const {
  NamedTensors out;
  for (auto& [name, t] : named_parameters()) out.emplace_back(name, autograd::detach(t));
  return out;
}

Module::LoadResult Module::load_state_dict(const NamedTensors& state, bool strict) {
  NamedTensors params = named_parameters();
  std::map<std::string, const Tensor*> given;
  std::vector<std::string> duplicates;
  for (const auto& [name, t] : state)
    if (!given.emplace(name, &t).second) duplicates.push_back(name);

  LoadResult result;
  std::vector<std::string> misshaped;
  for (const auto& [name, p] : params) {
    auto it = given.find(name);
    if (it == given.end()) {
      result.missing_keys.push_back(name);
    } else if (it->second->shape() != p.shape()) {
      misshaped.push_back(str(name, ": checkpoint ", it->second->shape(), " vs model ", p.shape()));
    }
  }
  for (const auto& entry : state) {
    const std::string& name = entry.first;  // (not a structured binding: clang 14 lambdas cannot capture one)
    bool known = std::any_of(params.begin(), params.end(), [&](const auto& p) { return p.first == name; });
    if (!known) result.unexpected_keys.push_back(name);
  }

  bool fail = !misshaped.empty() || !duplicates.empty() ||
              (strict && (!result.missing_keys.empty() || !result.unexpected_keys.empty()));
  if (fail) {
    std::string msg = "load_state_dict: the state does not match the model";
    auto list = [&msg](const char* what, const std::vector<std::string>& names) {
      if (names.empty()) return;
      msg += str("\n  ", what, " (", names.size(), "):");
      for (const auto& n : names) msg += "\n    " + n;
    };
    if (strict) list("missing", result.missing_keys);
    if (strict) list("unexpected", result.unexpected_keys);
    list("mis-shaped", misshaped);
    list("duplicated", duplicates);
    throw Error(msg);
  }

  NoGradGuard no_grad;  // copying into leaves that require grad is not part of any graph
  for (const auto& [name, p] : params) {
    auto it = given.find(name);
    if (it != given.end()) ops::copy_(p, *it->second);
  }
  return result;
}

}  // namespace loom::nn
