// Softmax and log-softmax of one row of n values, numerically stable
// (subtract the row max before exp). T is the compute type (float/double).
// Row sums go through row_sum (16 partial sums, vectorised) and exp through
// exp_approx (vectorised); see those headers for why.
#pragma once

#include <cmath>

#include "tensor/kernels/exp.h"
#include "tensor/kernels/row_sum.h"
#include "tensor/macros.h"

namespace loom::kernels {

// y = softmax(x) over one row. x and y may alias.
template <class T>
LOOM_HOST_DEVICE void softmax_row(const T* x, T* y, long n) {
  T m = row_max(x, n);
  for (long i = 0; i < n; ++i) y[i] = exp_approx(x[i] - m);
  T s = row_sum<T>(n, [&](long i) { return y[i]; });
  T inv = T(1) / s;
  for (long i = 0; i < n; ++i) y[i] *= inv;
}

// Causal attention's softmax, fused: one row i of scores x[0..n) where only
// the first `visible` (= i + 1) keys may be seen:
//   y[j] = softmax_j(scale * x[j]) over j < visible,  y[j] = 0 for j >= visible.
// The same as scaling, filling the hidden scores with -inf and calling
// softmax_row (exp(-inf) adds exactly 0 to the sum), in one pass. The work
// covers `visible` rounded up to whole vectors of 16 (hidden entries inside
// it are -inf, then 0); the rest of the row is never exponentiated.
template <class T>
LOOM_HOST_DEVICE void causal_softmax_row(const T* x, T* y, long n, long visible, T scale) {
  const long w = (visible + 15) / 16 * 16 < n ? (visible + 15) / 16 * 16 : n;
  const T neg_inf = -INFINITY;
  for (long j = 0; j < w; ++j) y[j] = j < visible ? x[j] * scale : neg_inf;
  T m = row_max(y, w);
  for (long j = 0; j < w; ++j) y[j] = exp_approx(y[j] - m);
  T s = row_sum<T>(w, [&](long j) { return y[j]; });
  T inv = T(1) / s;
  for (long j = 0; j < w; ++j) y[j] *= inv;
  for (long j = w; j < n; ++j) y[j] = T(0);
}

// y = log_softmax(x) = (x - max) - log(sum exp(x - max)). Subtracting max
// first matters: x - (max + log s) rounds max + log s at the scale of max and
// loses log s's low bits (3e-5 off at logits of 1000 in fp32).
template <class T>
LOOM_HOST_DEVICE void log_softmax_row(const T* x, T* y, long n) {
  T m = row_max(x, n);
  T s = row_sum<T>(n, [&](long i) { return exp_approx(x[i] - m); });
  T log_s = std::log(s);
  for (long i = 0; i < n; ++i) y[i] = (x[i] - m) - log_s;
}

// dx = y * (dy - sum(dy * y)) for y = softmax(x).
template <class T>
LOOM_HOST_DEVICE void softmax_backward_row(const T* dy, const T* y, T* dx, long n) {
  T dot = row_sum<T>(n, [&](long i) { return dy[i] * y[i]; });
  for (long i = 0; i < n; ++i) dx[i] = y[i] * (dy[i] - dot);
}

// Backward of causal_softmax_row: dx = scale * y * (dy - sum(dy * y)) on the
// visible part (softmax_backward_row, then the scale), 0 on the hidden part.
template <class T>
LOOM_HOST_DEVICE void causal_softmax_backward_row(const T* dy, const T* y, T* dx, long n, long visible, T scale) {
  const long w = (visible + 15) / 16 * 16 < n ? (visible + 15) / 16 * 16 : n;
  T dot = row_sum<T>(w, [&](long j) { return j < visible ? dy[j] * y[j] : T(0); });
  for (long j = 0; j < w; ++j) dx[j] = j < visible ? (y[j] * (dy[j] - dot)) * scale : T(0);
  for (long j = w; j < n; ++j) dx[j] = T(0);
}

// dx = dy - exp(y) * sum(dy) for y = log_softmax(x).
template <class T>
LOOM_HOST_DEVICE void log_softmax_backward_row(const T* dy, const T* y, T* dx, long n) {
  T s = row_sum<T>(n, [&](long i) { return dy[i]; });
  for (long i = 0; i < n; ++i) dx[i] = dy[i] - exp_approx(y[i]) * s;
}

}  // namespace loom::kernels
