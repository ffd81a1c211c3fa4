// LayerNorm over one row of C values (Ba et al. 2016), fused: one pass for
// the statistics, one for the output; mean and rstd are saved for backward.
//   y = (x - mean) * rstd * w + b,  rstd = 1 / sqrt(var + eps)  (biased var)
// Row sums use row_sum (16 partial sums, vectorised; see row_sum.h).
#pragma once

#include <cmath>

#include "tensor/kernels/row_sum.h"
#include "tensor/macros.h"

namespace loom::kernels {

// w, b may be null (no affine). Returns mean and rstd through the pointers.
template <class T>
LOOM_HOST_DEVICE void layernorm_row(const T* x, const T* w, const T* b, T* y, long C, T eps,
                                    T* mean_out, T* rstd_out) {
  const T m = row_sum<T>(C, [&](long i) { return x[i]; }) / T(C);
  const T v = row_sum<T>(C, [x, m](long i) { T d = x[i] - m; return d * d; }) / T(C);
  const T rstd = T(1) / std::sqrt(v + eps);
  if (w && b) {  // the usual case, a loop without branches
    for (long i = 0; i < C; ++i) y[i] = ((x[i] - m) * rstd) * w[i] + b[i];
  } else {
    for (long i = 0; i < C; ++i) {
      T n = (x[i] - m) * rstd;
      y[i] = n * (w ? w[i] : T(1)) + (b ? b[i] : T(0));
    }
  }
  *mean_out = m;
  *rstd_out = rstd;
}

// One row's share of the weight and bias gradients, columns [c0, c1):
//   dw[i] += dy[i] * n[i],  db[i] += dy[i]   (dw/db may be null)
// Summed over rows in row order; a CPU loop may give each thread its own columns.
template <class T>
LOOM_HOST_DEVICE void layernorm_param_grads_row(const T* dy, const T* x, T mean, T rstd, T* dw, T* db, long c0,
                                                long c1) {
  if (dw)
    for (long i = c0; i < c1; ++i) dw[i] += dy[i] * ((x[i] - mean) * rstd);
  if (db)
    for (long i = c0; i < c1; ++i) db[i] += dy[i];
}

// Backward of one row. dx is written; dw/db (may be null) are accumulated.
//   n = (x - mean) rstd,  g = dy * w
//   dx = rstd * (g - mean(g) - n * mean(g * n))
template <class T>
LOOM_HOST_DEVICE void layernorm_backward_row(const T* dy, const T* x, const T* w, T mean, T rstd,
                                             T* dx, T* dw, T* db, long C) {
  auto n = [&](long i) { return (x[i] - mean) * rstd; };
  auto row = [&](auto g) {  // g(i) = dy[i] * w[i]; a loop per case, so each vectorises
    const T g_mean = row_sum<T>(C, [&](long i) { return g(i); }) / T(C);
    const T gn_mean = row_sum<T>(C, [&](long i) { return g(i) * n(i); }) / T(C);
    for (long i = 0; i < C; ++i) dx[i] = rstd * (g(i) - g_mean - n(i) * gn_mean);
  };
  if (w) row([&](long i) { return dy[i] * w[i]; });
  else row([&](long i) { return dy[i]; });
  layernorm_param_grads_row(dy, x, mean, rstd, dw, db, 0, C);
}

}  // namespace loom::kernels
