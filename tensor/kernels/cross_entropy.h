// Cross-entropy of one row of V logits against a target class, fused
// log-softmax + NLL: loss = logsumexp(x) - x[target]. The row's logsumexp is
// saved so backward is one pass: dx = (exp(x - lse) - onehot(target)) * scale.
#pragma once

#include <cmath>

#include "tensor/kernels/exp.h"
#include "tensor/kernels/row_sum.h"
#include "tensor/macros.h"

namespace loom::kernels {

template <class T>
LOOM_HOST_DEVICE T logsumexp_row(const T* x, long V) {
  T m = row_max(x, V);
  T s = row_sum<T>(V, [&](long i) { return exp_approx(x[i] - m); });
  return m + std::log(s);
}

// Returns the row's loss; *lse receives logsumexp(x). The loss is formed as
// (max - x[target]) + log s rather than lse - x[target], which would cancel
// at the scale of the logits and lose log s's low bits.
template <class T>
LOOM_HOST_DEVICE T cross_entropy_row(const T* x, long V, long target, T* lse) {
  T m = row_max(x, V);
  T s = row_sum<T>(V, [&](long i) { return exp_approx(x[i] - m); });
  T log_s = std::log(s);
  *lse = m + log_s;
  return (m - x[target]) + log_s;
}

// dx[i] = (softmax(x)[i] - [i == target]) * scale
template <class T>
LOOM_HOST_DEVICE void cross_entropy_backward_row(const T* x, long V, long target, T lse, T scale, T* dx) {
  for (long i = 0; i < V; ++i) dx[i] = (exp_approx(x[i] - lse) - (i == target ? T(1) : T(0))) * scale;
}

}  // namespace loom::kernels
