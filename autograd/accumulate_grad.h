// AccumulateGrad: the node that ends every path to a leaf parameter. It adds the
// incoming (already summed) gradient into param.grad, then runs two kinds of
// hooks - the hook points data parallelism is built on:
//   1. grad_accumulator(param)->register_hook(fn)   picotron's grad_acc_fn.register_hook,
//      Megatron's grad-buffer hook (DataParallelBucket);
//   2. register_post_accumulate_grad_hook(param, fn)   PyTorch 2.1's convenience
//      (DataParallelNaive).
// Both receive the parameter, with its .grad set, and both return a
// RemovableHandle (autograd/hooks.h): the hook is registered while it lives.
#pragma once

#include <memory>

#include "autograd/hooks.h"
#include "autograd/node.h"

namespace loom::autograd {

struct AccumulateGrad : Node {
  explicit AccumulateGrad(Tensor param);
  TensorList apply(TensorList&& grads) override;
  std::string name() const override { return "AccumulateGrad"; }

  // fn(param) runs right after the gradient is accumulated, in registration
  // order, until the handle goes. The handle also keeps this node alive (the
  // param's meta holds it weakly), as picotron keeps grad_acc_fn.
  RemovableHandle register_hook(GradHook fn);
  size_t num_hooks() const { return hooks_->size(); }

  Tensor variable;  // the leaf parameter (strong ref, as in PyTorch)

 private:
  std::shared_ptr<HookList> hooks_ = std::make_shared<HookList>();
};

// The one AccumulateGrad node of a leaf that requires grad, created on first
// call (or by the first op that uses the leaf) and shared by every use.
std::shared_ptr<AccumulateGrad> grad_accumulator(const Tensor& param);

// fn(param) runs after param's gradient is accumulated in a backward pass,
// until the handle goes.
RemovableHandle register_post_accumulate_grad_hook(const Tensor& param, GradHook fn);

}  // namespace loom::autograd
