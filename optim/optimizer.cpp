#include "optim/optimizer.h"

#include <map>
#include <set>

#include "autograd/variable.h"
#include "tensor/ops.h"

namespace loom::optim {

Optimizer::Optimizer(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {
  LOOM_CHECK(!groups_.empty(), "Optimizer: no param groups given");
  std::set<const TensorImpl*> seen;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    LOOM_CHECK(group.lr >= 0, "Optimizer: group ", g, " ('", group.name, "'): lr must be >= 0, got ", group.lr);
    LOOM_CHECK(group.weight_decay >= 0, "Optimizer: group ", g, " ('", group.name,
               "'): weight_decay must be >= 0, got ", group.weight_decay);
    for (size_t i = 0; i < group.params.size(); ++i) {
      const Tensor& p = group.params[i];
      LOOM_CHECK(p.defined(), "Optimizer: group ", g, " ('", group.name, "') param ", i, " is undefined");
      LOOM_CHECK(is_floating(p.dtype()), "Optimizer: ", describe_param(g, i), " has dtype ", dtype_name(p.dtype()),
                 "; only floating params can be optimized");
      // The same param twice would be updated twice per step (PyTorch refuses too).
      LOOM_CHECK(seen.insert(p.impl()).second, "Optimizer: ", describe_param(g, i),
                 " appears more than once in the param groups");
    }
  }
}

Optimizer::~Optimizer() = default;

void Optimizer::zero_grad(bool set_to_none) {
  for (const ParamGroup& group : groups_) autograd::zero_grad(group.params, set_to_none);
}

void Optimizer::set_lr(double lr) {
  LOOM_CHECK(lr >= 0, "Optimizer::set_lr: lr must be >= 0, got ", lr);
  for (ParamGroup& group : groups_) group.lr = lr;
}

Tensor Optimizer::grad_of(const Tensor& param) const {
  return grad_source_ ? grad_source_(param) : autograd::grad(param);
}

std::string Optimizer::describe_param(size_t group, size_t index) const {
  const ParamGroup& g = groups_[group];
  std::string s = str("group ", group);
  if (!g.name.empty()) s += str(" ('", g.name, "')");
  return s + str(" param ", index, " ", g.params[index].shape());
}

static std::string state_key(size_t group, size_t index, const std::string& name) {
  return str("state.", group, ".", index, ".", name);
}

NamedTensors Optimizer::state_dict() const {
  NamedTensors out;
  for (size_t g = 0; g < groups_.size(); ++g)
    for (size_t i = 0; i < groups_[g].params.size(); ++i)
      for (auto& [name, t] : param_state(g, i)) out.emplace_back(state_key(g, i, name), t);
  return out;
}

void Optimizer::load_state_dict(const NamedTensors& state) {
  std::map<std::string, Tensor> given;
  for (const auto& [name, t] : state) {
    LOOM_CHECK(given.emplace(name, t).second, "load_state_dict: entry ", name, " appears twice");
  }
  // Check everything first, so that a bad dict leaves the optimizer unchanged.
  NamedTensors expected = state_dict();
  for (const auto& [name, dst] : expected) {
    auto it = given.find(name);
    LOOM_CHECK(it != given.end(), "load_state_dict: missing entry ", name, " (expected ", dst.describe(), ")");
    const Tensor& src = it->second;
    LOOM_CHECK(src.defined(), "load_state_dict: entry ", name, " is undefined (expected ", dst.describe(), ")");
    LOOM_CHECK(src.shape() == dst.shape(), "load_state_dict: entry ", name, " has shape ", src.shape(),
               ", expected ", dst.shape());
    LOOM_CHECK(src.dtype() == dst.dtype(), "load_state_dict: entry ", name, " has dtype ", dtype_name(src.dtype()),
               ", expected ", dtype_name(dst.dtype()));
  }
  if (given.size() != expected.size()) {
    std::set<std::string> known;
    for (const auto& e : expected) known.insert(e.first);
    for (const auto& [name, t] : given)
      LOOM_CHECK(known.count(name), "load_state_dict: unexpected entry ", name, " ", t.describe(),
                 " (this optimizer has ", groups_.size(), " param groups and ", expected.size(), " state entries)");
  }
  for (const auto& [name, dst] : expected) ops::copy_(dst, given.at(name));
}

}  // namespace loom::optim
