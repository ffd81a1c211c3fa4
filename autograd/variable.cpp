#include "autograd/variable.h"

#include "autograd/accumulate_grad.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::autograd {

void AutogradMeta::check_inplace(const char* op) const {
  if (requires_grad && !grad_fn && GradMode::is_enabled())
    throw Error(str(op, ": a leaf tensor that requires grad is used in an in-place operation; wrap the update in "
                        "NoGradGuard (as an optimizer step does)"));
}

AutogradMeta& meta(const Tensor& t) {
  LOOM_CHECK(t.defined(), "autograd: tensor is undefined");
  auto& slot = t.impl()->autograd_meta;
  if (!slot) slot = std::make_shared<AutogradMeta>();
  return static_cast<AutogradMeta&>(*slot);
}

AutogradMeta* meta_if(const Tensor& t) {
  if (!t.defined() || !t.impl()->autograd_meta) return nullptr;
  return static_cast<AutogradMeta*>(t.impl()->autograd_meta.get());
}

bool requires_grad(const Tensor& t) {
  AutogradMeta* m = meta_if(t);
  return m && (m->requires_grad || m->grad_fn);
}

const Tensor& set_requires_grad(const Tensor& t, bool value) {
  LOOM_CHECK(is_floating(t.dtype()) || !value, "set_requires_grad: only floating tensors can require grad, got ",
             t.describe());
  LOOM_CHECK(is_leaf(t), "set_requires_grad: only leaf tensors can be marked (this one was produced by ",
             grad_fn(t)->name(), "); use detach() first");
  meta(t).requires_grad = value;
  return t;
}

bool is_leaf(const Tensor& t) {
  AutogradMeta* m = meta_if(t);
  return !m || !m->grad_fn;
}

std::shared_ptr<Node> grad_fn(const Tensor& t) {
  AutogradMeta* m = meta_if(t);
  return m ? m->grad_fn : nullptr;
}

Tensor grad(const Tensor& t) {
  AutogradMeta* m = meta_if(t);
  return m ? m->grad : Tensor();
}

void set_grad(const Tensor& t, const Tensor& g) {
  if (g.defined())
    LOOM_CHECK(g.shape() == t.shape(), "set_grad: gradient ", g.shape(), " does not match tensor ", t.shape());
  meta(t).grad = g;
}

void zero_grad(const std::vector<Tensor>& params, bool set_to_none) {
  for (const Tensor& p : params) {
    AutogradMeta* m = meta_if(p);
    if (!m || !m->grad.defined()) continue;
    if (set_to_none) m->grad = Tensor();
    else ops::zero_(m->grad);
  }
}

void retain_grad(const Tensor& t) {
  AutogradMeta& m = meta(t);
  if (!m.grad_fn) return;  // leaves keep their grad anyway
  if (m.retains_grad) return;
  m.retains_grad = true;
  // Weak: the node must not keep its own output alive.
  std::weak_ptr<TensorImpl> weak = t.impl_ptr();
  int nr = m.output_nr;
  m.grad_fn->pre_hooks.push_back([weak, nr](const Tensor& g, int output_nr) {
    if (output_nr != nr) return;
    auto impl = weak.lock();
    if (!impl) return;
    Tensor self(impl);
    AutogradMeta& sm = meta(self);
    if (sm.grad.defined()) {
      NoGradGuard guard;
      sm.grad = ops::add(sm.grad, g);
    } else {
      sm.grad = ops::clone(g);
    }
  });
}

Tensor detach(const Tensor& t) { return t.alias(); }

Edge gradient_edge(const Tensor& t) {
  AutogradMeta* m = meta_if(t);
  if (!m) return {};
  if (m->grad_fn) return {m->grad_fn, m->output_nr};
  if (m->requires_grad) return {grad_accumulator(t), 0};
  return {};
}

}  // namespace loom::autograd
