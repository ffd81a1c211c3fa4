// Softmax and log-softmax of one row of n values, numerically stable
// (subtract the row max before exp). T is the compute type (float/double);
// In/Out are storage types converted with load/store functors.
#pragma once

#include <cmath>

#include "tensor/macros.h"

namespace loom::kernels {

// y = softmax(x) over one row. x and y may alias.
template <class T>
LOOM_HOST_DEVICE void softmax_row(const T* x, T* y, long n) {
  T m = x[0];
  for (long i = 1; i < n; ++i) m = x[i] > m ? x[i] : m;
  T s = 0;
  for (long i = 0; i < n; ++i) { y[i] = std::exp(x[i] - m); s += y[i]; }
  T inv = T(1) / s;
  for (long i = 0; i < n; ++i) y[i] *= inv;
}

// y = log_softmax(x) = (x - max) - log(sum exp(x - max)). Subtracting max
// first matters: x - (max + log s) rounds max + log s at the scale of max and
// loses log s's low bits (3e-5 off at logits of 1000 in fp32).
template <class T>
LOOM_HOST_DEVICE void log_softmax_row(const T* x, T* y, long n) {
  T m = x[0];
  for (long i = 1; i < n; ++i) m = x[i] > m ? x[i] : m;
  T s = 0;
  for (long i = 0; i < n; ++i) s += std::exp(x[i] - m);
  T log_s = std::log(s);
  for (long i = 0; i < n; ++i) y[i] = (x[i] - m) - log_s;
}

// dx = y * (dy - sum(dy * y)) for y = softmax(x).
template <class T>
LOOM_HOST_DEVICE void softmax_backward_row(const T* dy, const T* y, T* dx, long n) {
  T dot = 0;
  for (long i = 0; i < n; ++i) dot += dy[i] * y[i];
  for (long i = 0; i < n; ++i) dx[i] = y[i] * (dy[i] - dot);
}

// dx = dy - exp(y) * sum(dy) for y = log_softmax(x).
template <class T>
LOOM_HOST_DEVICE void log_softmax_backward_row(const T* dy, const T* y, T* dx, long n) {
  T s = 0;
  for (long i = 0; i < n; ++i) s += dy[i];
  for (long i = 0; i < n; ++i) dx[i] = dy[i] - std::exp(y[i]) * s;
}

}  // namespace loom::kernels
