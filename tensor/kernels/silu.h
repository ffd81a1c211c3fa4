// SiLU (Swish, Elfwing et al. 2017; Ramachandran et al. 2017): the gate of
// Llama's SwiGLU MLP, down(silu(gate(x)) * up(x)) (Shazeer 2020).
//   silu(x) = x sigmoid(x) = x / (1 + exp(-x))
// One element; shared by the CPU loop (ops_elementwise.cpp) and the CUDA kernel
// (cuda/elementwise.cu). exp_approx vectorises, as for GELU (exp.h).
#pragma once

#include "tensor/kernels/exp.h"
#include "tensor/macros.h"

namespace loom::kernels {

template <class T>
LOOM_HOST_DEVICE T silu(T x) {
  return x / (T(1) + exp_approx(-x));
}

// d silu / dx, times the incoming gradient g. With s = sigmoid(x):
//   d/dx [x s] = s + x s (1 - s) = s (1 + x (1 - s))
template <class T>
LOOM_HOST_DEVICE T silu_backward(T g, T x) {
  const T s = T(1) / (T(1) + exp_approx(-x));
  return g * (s * (T(1) + x * (T(1) - s)));
}

}  // namespace loom::kernels
