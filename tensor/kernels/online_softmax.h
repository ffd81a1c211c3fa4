// The online softmax (Milakov & Gimelshein 2018): a row's max m and its sum
// s = sum exp(x - m) in ONE pass, for the fast softmax and cross-entropy
// kernels (tensor/cuda/fast/). Each lane folds its values into a MaxSum; two
// MaxSums merge by rescaling the smaller max's sum. The reference kernels
// (softmax.h, cross_entropy.h) read the row twice: once for the max, once
// for the sum.
//
//   add(x):    m' = max(m, x),   s' = s exp(m - m') + exp(x - m')   (one exp: the branch picks which)
//   merge:     m  = max(ma, mb), s  = sa exp(ma - m) + sb exp(mb - m)
// merge is commutative bit for bit (a + b == b + a, max too), so after a
// butterfly of shuffles every lane of a warp holds the same bits.
#pragma once

#include <cmath>

#include "tensor/kernels/exp.h"
#include "tensor/macros.h"

namespace loom::kernels {

template <class T>
struct MaxSum {
  T m;  // running max (-inf: nothing seen yet)
  T s;  // sum of exp(x - m) over what was seen
};

// What a lane holds before its first value: the identity of merge.
template <class T>
LOOM_HOST_DEVICE MaxSum<T> max_sum_empty() {
  return {T(-INFINITY), T(0)};
}

// Folds one value in. -inf adds exactly nothing (a masked score); NaN makes
// the sum NaN, as in the two-pass reference.
template <class T>
LOOM_HOST_DEVICE void max_sum_add(MaxSum<T>& a, T x) {
  if (x > a.m) {
    a.s = a.s * exp_approx(a.m - x) + T(1);  // exp(-inf) = 0 on the first value
    a.m = x;
  } else if (x != T(-INFINITY)) {
    a.s += exp_approx(x - a.m);
  }
}

// Two lanes' (or two warps') partial results as one.
template <class T>
LOOM_HOST_DEVICE MaxSum<T> max_sum_merge(MaxSum<T> a, MaxSum<T> b) {
  const T m = a.m > b.m ? a.m : b.m;
  if (m == T(-INFINITY)) return {m, T(0)};  // both empty: exp(-inf - -inf) would be NaN
  return {m, a.s * exp_approx(a.m - m) + b.s * exp_approx(b.m - m)};
}

}  // namespace loom::kernels
