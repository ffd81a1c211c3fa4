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

// An op with weights whose gradients can wait (zero-bubble's W, engine.h):
// its edges are `inputs` then `weights`; input_backward returns one gradient
// per input, weight_backward one per weight. An ordinary backward runs both.
Tensor record_split(const char* name, std::initializer_list<const Tensor*> inputs,
                    std::initializer_list<const Tensor*> weights, Tensor out, FunctionNode::BackwardFn input_backward,
                    FunctionNode::BackwardFn weight_backward);

}  // namespace loom::autograd
