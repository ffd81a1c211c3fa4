// GELU, tanh approximation (GPT-2, Hendrycks & Gimpel 2016):
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// One element; shared by the CPU loop and the future CUDA kernel.
#pragma once

#include <cmath>

#include "tensor/macros.h"

namespace loom::kernels {

template <class T>
LOOM_HOST_DEVICE T gelu(T x) {
  const T k = T(0.7978845608028654);  // sqrt(2/pi)
  T u = k * (x + T(0.044715) * x * x * x);
  return T(0.5) * x * (T(1) + std::tanh(u));
}

// d gelu / dx, times the incoming gradient g.
template <class T>
LOOM_HOST_DEVICE T gelu_backward(T g, T x) {
  const T k = T(0.7978845608028654);
  T x2 = x * x;
  T u = k * (x + T(0.044715) * x2 * x);
  T t = std::tanh(u);
  T du = k * (T(1) + T(3 * 0.044715) * x2);
  return g * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du);
}

}  // namespace loom::kernels
