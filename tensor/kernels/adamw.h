// AdamW, one element (Loshchilov & Hutter 2019, "Decoupled Weight Decay
// Regularization"), in exactly torch.optim.AdamW's order:
//   p <- p * (1 - lr * wd)                          decoupled weight decay, first
//   m <- beta1 * m + (1 - beta1) * g                 first moment  (exp_avg)
//   v <- beta2 * v + (1 - beta2) * g^2               second moment (exp_avg_sq)
//   p <- p - lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps),  bc_k = 1 - beta_k^step
// The per-step scalars are computed once on the host, in double (as PyTorch
// does in Python), then rounded to the compute type; the element update is
// shared by the CPU loop (optim/adamw.cpp) and a future CUDA kernel.
#pragma once

#include <cmath>
#include <cstdint>

#include "tensor/macros.h"

namespace loom::kernels {

// What every element of one param needs for one step. T is the compute type
// (float; double for float64 params).
template <class T>
struct AdamWScalars {
  T decay;                  // 1 - lr * weight_decay
  T beta1, one_minus_beta1;
  T beta2, one_minus_beta2;
  T step_size;              // lr / (1 - beta1^step)
  T bias_correction2_sqrt;  // sqrt(1 - beta2^step)
  T eps;
};

// Host side, once per param per step. step counts from 1 (the step being taken).
template <class T>
inline AdamWScalars<T> adamw_scalars(double lr, double beta1, double beta2, double eps, double weight_decay,
                                     int64_t step) {
  double bias_correction1 = 1.0 - std::pow(beta1, double(step));
  double bias_correction2 = 1.0 - std::pow(beta2, double(step));
  return {T(1.0 - lr * weight_decay), T(beta1),          T(1.0 - beta1),
          T(beta2),                   T(1.0 - beta2),    T(lr / bias_correction1),
          T(std::sqrt(bias_correction2)), T(eps)};
}

// p, m, v are updated in place; g is this element's gradient.
template <class T>
LOOM_HOST_DEVICE void adamw_update(T& p, T& m, T& v, T g, const AdamWScalars<T>& s) {
  p = p * s.decay;
  m = s.beta1 * m + s.one_minus_beta1 * g;
  v = s.beta2 * v + s.one_minus_beta2 * g * g;
  T denom = std::sqrt(v) / s.bias_correction2_sqrt + s.eps;
  p = p - s.step_size * (m / denom);
}

}  // namespace loom::kernels
