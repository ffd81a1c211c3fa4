// Autograd state of a tensor (PyTorch's AutogradMeta): requires_grad, the
// accumulated .grad, the node that produced it (grad_fn), and hooks.
// Free functions in loom::autograd read and write it: requires_grad(t),
// grad(t), set_requires_grad(t), detach(t), retain_grad(t).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "autograd/hooks.h"
#include "autograd/node.h"
#include "tensor/tensor.h"

namespace loom::autograd {

struct AccumulateGrad;

struct AutogradMeta : AutogradMetaInterface {
  bool requires_grad = false;
  bool retains_grad = false;
  Tensor grad;                                   // accumulated gradient (leaves, retained non-leaves)
  std::shared_ptr<Node> grad_fn;                 // null for leaves
  int output_nr = 0;                             // which output of grad_fn this tensor is
  std::weak_ptr<AccumulateGrad> grad_accumulator;  // created lazily, shared by all uses of the leaf
  std::shared_ptr<HookList> post_accumulate_grad_hooks;  // created by the first registration

  void check_inplace(const char* op) const override;
};

// The meta of t, created on first use.
AutogradMeta& meta(const Tensor& t);
// The meta of t, or null when it has none (no autograd state at all).
AutogradMeta* meta_if(const Tensor& t);

bool requires_grad(const Tensor& t);
// Marks a leaf as requiring grad; returns t. Error on a non-leaf or an integer tensor.
const Tensor& set_requires_grad(const Tensor& t, bool value = true);
bool is_leaf(const Tensor& t);
std::shared_ptr<Node> grad_fn(const Tensor& t);

// The accumulated gradient (undefined until a backward reaches t).
Tensor grad(const Tensor& t);
void set_grad(const Tensor& t, const Tensor& g);  // undefined g = "set to none"
// Drops every gradient (set_to_none, PyTorch's default) or zeroes them in place.
void zero_grad(const std::vector<Tensor>& params, bool set_to_none = true);

// Keep the gradient of a non-leaf tensor after backward (PyTorch's retain_grad).
void retain_grad(const Tensor& t);
// A tensor sharing t's storage, outside any graph (requires_grad = false).
Tensor detach(const Tensor& t);

// Where a gradient of t must be sent: its grad_fn, its AccumulateGrad (leaf
// requiring grad), or nothing.
Edge gradient_edge(const Tensor& t);

}  // namespace loom::autograd
