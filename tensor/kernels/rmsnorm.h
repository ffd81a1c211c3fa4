// RMSNorm over one row of C values (Zhang & Sennrich 2019; Llama's norm):
// LayerNorm without the mean and without a bias. rstd is saved for backward.
//   y = x * rstd * w,  rstd = 1 / sqrt(mean(x²) + eps)
// Row sums use row_sum (see row_sum.h), as layernorm.h does.
#pragma once

#include <cmath>

#include "tensor/kernels/row_sum.h"
#include "tensor/macros.h"

namespace loom::kernels {

// w may be null (no scale). Returns rstd through the pointer.
template <class T>
LOOM_HOST_DEVICE void rmsnorm_row(const T* x, const T* w, T* y, long C, T eps, T* rstd_out) {
  const T ms = row_sum<T>(C, [x](long i) { return x[i] * x[i]; }) / T(C);
  const T rstd = T(1) / std::sqrt(ms + eps);
  if (w) {
    for (long i = 0; i < C; ++i) y[i] = (x[i] * rstd) * w[i];
  } else {
    for (long i = 0; i < C; ++i) y[i] = x[i] * rstd;
  }
  *rstd_out = rstd;
}

// One row's share of the weight gradient, columns [c0, c1): dw[i] += dy[i] * n[i], n = x rstd.
// Summed over rows in row order (a CPU loop may give each thread its own columns).
template <class T>
LOOM_HOST_DEVICE void rmsnorm_weight_grad_row(const T* dy, const T* x, T rstd, T* dw, long c0, long c1) {
  for (long i = c0; i < c1; ++i) dw[i] += dy[i] * (x[i] * rstd);
}

// Backward of one row. dx is written; dw (may be null) is accumulated.
//   n = x rstd,  g = dy * w
//   dx = rstd * (g - n * mean(g * n))      (LayerNorm's formula without the mean(g) term)
template <class T>
LOOM_HOST_DEVICE void rmsnorm_backward_row(const T* dy, const T* x, const T* w, T rstd, T* dx, T* dw, long C) {
  auto row = [&](auto g) {  // g(i) = dy[i] * w[i]; a loop per case, so each vectorises
    const T gn_mean = row_sum<T>(C, [&](long i) { return g(i) * (x[i] * rstd); }) / T(C);
    for (long i = 0; i < C; ++i) dx[i] = rstd * (g(i) - (x[i] * rstd) * gn_mean);
  };
  if (w) row([&](long i) { return dy[i] * w[i]; });
  else row([&](long i) { return dy[i]; });
  if (dw) rmsnorm_weight_grad_row(dy, x, rstd, dw, 0, C);
}

}  // namespace loom::kernels
