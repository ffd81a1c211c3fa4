// LayerNorm over one row of C values (Ba et al. 2016), fused: one pass for
// the statistics, one for the output; mean and rstd are saved for backward.
//   y = (x - mean) * rstd * w + b,  rstd = 1 / sqrt(var + eps)  (biased var)
#pragma once

#include <cmath>

#include "tensor/macros.h"

namespace loom::kernels {

// w, b may be null (no affine). Returns mean and rstd through the pointers.
template <class T>
LOOM_HOST_DEVICE void layernorm_row(const T* x, const T* w, const T* b, T* y, long C, T eps,
                                    T* mean_out, T* rstd_out) {
  T m = 0;
  for (long i = 0; i < C; ++i) m += x[i];
  m /= T(C);
  T v = 0;
  for (long i = 0; i < C; ++i) { T d = x[i] - m; v += d * d; }
  v /= T(C);
  T rstd = T(1) / std::sqrt(v + eps);
  for (long i = 0; i < C; ++i) {
    T n = (x[i] - m) * rstd;
    y[i] = n * (w ? w[i] : T(1)) + (b ? b[i] : T(0));
  }
  *mean_out = m;
  *rstd_out = rstd;
}

// Backward of one row. dx is written; dw/db (may be null) are accumulated.
//   n = (x - mean) rstd,  g = dy * w
//   dx = rstd * (g - mean(g) - n * mean(g * n))
template <class T>
LOOM_HOST_DEVICE void layernorm_backward_row(const T* dy, const T* x, const T* w, T mean, T rstd,
                                             T* dx, T* dw, T* db, long C) {
  T g_mean = 0, gn_mean = 0;
  for (long i = 0; i < C; ++i) {
    T n = (x[i] - mean) * rstd;
    T g = dy[i] * (w ? w[i] : T(1));
    g_mean += g;
    gn_mean += g * n;
  }
  g_mean /= T(C);
  gn_mean /= T(C);
  for (long i = 0; i < C; ++i) {
    T n = (x[i] - mean) * rstd;
    T g = dy[i] * (w ? w[i] : T(1));
    dx[i] = rstd * (g - g_mean - n * gn_mean);
    if (dw) dw[i] += dy[i] * n;
    if (db) db[i] += dy[i];
  }
}

}  // namespace loom::kernels
