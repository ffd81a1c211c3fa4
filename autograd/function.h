// How a differentiable op records itself: compute the forward with the raw op,
// then record(name, inputs, out, backward) attaches a FunctionNode whose edges
// point at the inputs' gradient edges. Nothing is recorded in NoGradGuard or
// when no input requires grad.
//
// The backward closure captures what it needs. Capture inputs as they are;
// capture an op's own *output* only through out.alias() (a handle without
// autograd state), or the output would keep its own node alive forever.
#pragma once

#include <functional>

#include "autograd/node.h"

namespace loom::autograd {

bool any_requires_grad(std::initializer_list<const Tensor*> inputs);

Tensor record(const char* name, std::initializer_list<const Tensor*> inputs, Tensor out,
              FunctionNode::BackwardFn backward);
Tensor record(const char* name, const TensorList& inputs, Tensor out, FunctionNode::BackwardFn backward);

}  // namespace loom::autograd
