#include "autograd/accumulate_grad.h"

#include "autograd/variable.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::autograd {

AccumulateGrad::AccumulateGrad(Tensor param) : variable(std::move(param)) {
  // Run as soon as ready (PyTorch gives AccumulateGrad the max sequence_nr).
  sequence_nr = UINT64_MAX;
}

TensorList AccumulateGrad::apply(TensorList&& grads) {
  Tensor& g = grads[0];
  if (g.defined()) {
    NoGradGuard no_grad;
    AutogradMeta& m = meta(variable);
    LOOM_CHECK(g.shape() == variable.shape(), "AccumulateGrad: gradient ", g.shape(), " does not match parameter ",
               variable.shape());
    if (!m.grad.defined()) {
      // .grad needs a buffer of its own: the incoming gradient may be shared
      // with other nodes. A temporary that nothing else refers to (the usual
      // case: the output of the op's backward) is taken as it is, not copied.
      if (g.dtype() == variable.dtype() && g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 &&
          g.is_contiguous() && g.nbytes() == g.storage()->nbytes() && !g.impl()->autograd_meta) {
        m.grad = std::move(g);
      } else {
        Tensor gc = ops::to(g, variable.dtype());
        m.grad = gc.is_same(g) ? ops::clone(g) : ops::contiguous(gc);
      }
    } else {
      ops::add_(m.grad, ops::to(g, variable.dtype()));
    }
  }
  hooks_->run(variable);
  AutogradMeta* m = meta_if(variable);
  if (m && m->post_accumulate_grad_hooks) m->post_accumulate_grad_hooks->run(variable);
  return {};
}

RemovableHandle AccumulateGrad::register_hook(GradHook fn) {
  return RemovableHandle(hooks_, hooks_->add(std::move(fn)), shared_from_this());
}

std::shared_ptr<AccumulateGrad> grad_accumulator(const Tensor& param) {
  AutogradMeta& m = meta(param);
  LOOM_CHECK(!m.grad_fn, "grad_accumulator: only leaf tensors have one (this tensor was produced by ",
             m.grad_fn->name(), ")");
  LOOM_CHECK(m.requires_grad, "grad_accumulator: the tensor ", param.describe(), " does not require grad");
  if (auto acc = m.grad_accumulator.lock()) return acc;
  // The node holds the param strongly; the param's meta holds the node weakly,
  // so the node lives as long as some graph (or a hook owner) keeps it.
  auto acc = std::make_shared<AccumulateGrad>(Tensor(param.impl_ptr()));
  m.grad_accumulator = acc;
  return acc;
}

RemovableHandle register_post_accumulate_grad_hook(const Tensor& param, GradHook fn) {
  AutogradMeta& m = meta(param);
  LOOM_CHECK(!m.grad_fn && m.requires_grad,
             "register_post_accumulate_grad_hook: only leaf tensors that require grad, got ", param.describe());
  if (!m.post_accumulate_grad_hooks) m.post_accumulate_grad_hooks = std::make_shared<HookList>();
  return RemovableHandle(m.post_accumulate_grad_hooks, m.post_accumulate_grad_hooks->add(std::move(fn)));
}

}  // namespace loom::autograd
