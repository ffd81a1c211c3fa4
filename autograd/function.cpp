#include "autograd/function.h"

#include "autograd/variable.h"
#include "tensor/grad_mode.h"

namespace loom::autograd {

bool any_requires_grad(std::initializer_list<const Tensor*> inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor* t : inputs)
    if (t->defined() && requires_grad(*t)) return true;
  return false;
}

template <class Range>
static Tensor record_impl(const Range& inputs, Tensor out, std::shared_ptr<FunctionNode> node) {
  node->next_edges.reserve(inputs.size());
  for (const auto& in : inputs) {
    const Tensor& t = *in;
    // A raw op may hand back its input itself (to() with the same dtype,
    // contiguous() of a contiguous tensor): give the output its own handle.
    if (t.defined() && out.is_same(t)) out = out.alias();
    node->next_edges.push_back(t.defined() ? gradient_edge(t) : Edge{});
  }
  AutogradMeta& m = meta(out);
  m.grad_fn = std::move(node);
  m.output_nr = 0;
  return out;
}

Tensor record(const char* name, std::initializer_list<const Tensor*> inputs, Tensor out,
              FunctionNode::BackwardFn backward) {
  if (!any_requires_grad(inputs)) return out;
  return record_impl(inputs, std::move(out), std::make_shared<FunctionNode>(name, std::move(backward)));
}

Tensor record_split(const char* name, std::initializer_list<const Tensor*> inputs,
                    std::initializer_list<const Tensor*> weights, Tensor out, FunctionNode::BackwardFn input_backward,
                    FunctionNode::BackwardFn weight_backward) {
  std::vector<const Tensor*> edges(inputs);
  edges.insert(edges.end(), weights.begin(), weights.end());
  bool any = false;
  for (const Tensor* t : edges) any = any || any_requires_grad({t});
  if (!any) return out;
  return record_impl(edges, std::move(out),
                     std::make_shared<FunctionNode>(name, std::move(input_backward), std::move(weight_backward),
                                                    int(weights.size())));
}

Tensor record(const char* name, const TensorList& inputs, Tensor out, FunctionNode::BackwardFn backward) {
  if (!GradMode::is_enabled()) return out;
  bool any = false;
  for (const Tensor& t : inputs) any = any || (t.defined() && requires_grad(t));
  if (!any) return out;
  std::vector<const Tensor*> ptrs;
  for (const Tensor& t : inputs) ptrs.push_back(&t);
  return record_impl(ptrs, std::move(out), std::make_shared<FunctionNode>(name, std::move(backward)));
}

}  // namespace loom::autograd
