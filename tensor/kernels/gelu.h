// GELU, tanh approximation (GPT-2, Hendrycks & Gimpel 2016):
//   gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
// One element; shared by the CPU loop and the future CUDA kernel.
//
// Computed through the identity 0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + exp(-2u)):
// one exp (exp_approx, which vectorises; std::tanh is a call per element) and
// no cancellation in 1 + tanh(u) when u is very negative.
#pragma once

#include <cmath>

#include "tensor/kernels/exp.h"
#include "tensor/macros.h"

namespace loom::kernels {

template <class T>
LOOM_HOST_DEVICE T gelu(T x) {
  const T k = T(0.7978845608028654);  // sqrt(2/pi)
  T u = k * (x + T(0.044715) * x * x * x);
  return x / (T(1) + exp_approx(T(-2) * u));  // x * sigmoid(2u)
}

// d gelu / dx, times the incoming gradient g. With s = sigmoid(2u):
//   d/dx [x s] = s + x * 2 s (1 - s) * du/dx,  du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// (the same as 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx).
template <class T>
LOOM_HOST_DEVICE T gelu_backward(T g, T x) {
  const T k = T(0.7978845608028654);
  T x2 = x * x;
  T u = k * (x + T(0.044715) * x2 * x);
  T s = T(1) / (T(1) + exp_approx(T(-2) * u));
  T du = k * (T(1) + T(3 * 0.044715) * x2);
  return g * (s + T(2) * x * s * (T(1) - s) * du);
}

}  // namespace loom::kernels
