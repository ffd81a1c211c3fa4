// A finite-difference Jacobian checker, used by every differentiable op's test
// (Flashlight's jacobianTestImpl, torch.autograd.gradcheck).
//
// For f: inputs -> out, it checks the analytic gradient of the scalar
//   L(x) = sum(f(x) * R)
// where R is a fixed random float64 tensor of out's shape: one backward pass
// then sees a different weight on every output element, so a wrong entry
// anywhere in the Jacobian shows up (a plain sum(f(x)) would let errors that
// cancel across a row pass). Each element x_i of each input that requires grad
// is perturbed in place through the input's own view (strides and offset, so
// transposed and sliced inputs are checked as they are), and
//   dL/dx_i ~ (L(x + eps e_i) - L(x - eps e_i)) / (2 eps)
// is compared with the analytic value: |analytic - numeric| <= atol + rtol |numeric|.
// On failure the message names the input, the worst element's index, both
// values and how many elements were outside tolerance.
//
// Usage:
//   Tensor a = leaf(randn64({2, 3}, 1)), b = leaf(randn64({3}, 2));
//   EXPECT_TRUE(gradcheck([](const TensorList& x) { return x[0] * x[1]; }, {a, b}));
// Inputs must be float64 when they require grad (the difference quotient needs
// double precision); other inputs (indices, masks) are passed through as they are.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "tensor/grad_mode.h"

namespace loom::test {

using autograd::TensorList;
using GradFn = std::function<Tensor(const TensorList&)>;

struct GradcheckOptions {
  double eps = 1e-6;   // central-difference step
  double atol = 1e-6;  // |analytic - numeric| <= atol + rtol * |numeric|
  double rtol = 1e-6;
  uint64_t seed = 4242;  // for the weight tensor R
};

// A float64 tensor of N(0, 1) values drawn from its own seed.
inline Tensor randn64(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return randn(shape, gen, kFloat64);
}

// Uniform values in [low, high), float64, from their own seed.
inline Tensor rand64(const Shape& shape, uint64_t seed, double low, double high) {
  Generator gen(seed);
  return rand(shape, gen, kFloat64, low, high);
}

// Marks t as a leaf that requires grad and returns it.
inline Tensor leaf(const Tensor& t) {
  autograd::set_requires_grad(t);
  return t;
}

namespace detail {

// Row-major multi-index of flat position i in `shape`.
inline Shape unravel(int64_t i, const Shape& shape) {
  Shape idx(shape.size());
  for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) {
    idx[size_t(d)] = i % shape[size_t(d)];
    i /= shape[size_t(d)];
  }
  return idx;
}

// Element offset (from element [0, ..., 0]) of a multi-index under the view's strides.
inline int64_t strided_offset(const Shape& idx, const Shape& strides) {
  int64_t off = 0;
  for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * strides[d];
  return off;
}

inline std::string fmt(double v) {
  std::ostringstream os;
  os.precision(12);
  os << v;
  return os.str();
}

// sum(out * R), in double on the host.
inline double weighted_sum(const Tensor& out, const std::vector<double>& r) {
  std::vector<double> v = out.to_vector<double>();
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += v[i] * r[i];
  return s;
}

}  // namespace detail

inline ::testing::AssertionResult gradcheck(const GradFn& f, const TensorList& inputs, GradcheckOptions opt = {}) {
  using ::testing::AssertionFailure;
  namespace ag = autograd;

  std::vector<size_t> checked;  // inputs that require grad
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& x = inputs[k];
    if (!x.defined() || !ag::requires_grad(x)) continue;
    if (!ag::is_leaf(x))
      return AssertionFailure() << "gradcheck: input " << k << " is not a leaf (pass the tensor that requires grad)";
    if (x.dtype() != kFloat64)
      return AssertionFailure() << "gradcheck: input " << k << " is " << x.describe() << "; inputs that require grad "
                                << "must be float64";
    for (int64_t d = 0; d < x.dim(); ++d)
      if (x.stride(d) == 0 && x.size(d) > 1)
        return AssertionFailure() << "gradcheck: input " << k << " " << x.describe()
                                  << " is expanded (stride 0 in dim " << d
                                  << "): perturbing one element would move several";
    checked.push_back(k);
  }
  if (checked.empty()) return AssertionFailure() << "gradcheck: no input requires grad";

  // ---- analytic: one backward of sum(f(x) * R) ----
  for (size_t k : checked) ag::set_grad(inputs[k], Tensor());
  Tensor out = f(inputs);
  if (out.dtype() != kFloat64)
    return AssertionFailure() << "gradcheck: f returned " << out.describe() << "; it must return float64";
  Generator gen(opt.seed);
  Tensor R = ops::view(randn({out.numel()}, gen, kFloat64), out.shape());
  const std::vector<double> r = R.to_vector<double>();
  try {
    ag::backward(ag::sum(ag::mul(out, R)));
  } catch (const Error& e) {
    return AssertionFailure() << "gradcheck: backward threw: " << e.what();
  }
  std::vector<std::vector<double>> analytic;
  for (size_t k : checked) {
    const Tensor& x = inputs[k];
    Tensor g = ag::grad(x);
    if (!g.defined()) {
      analytic.emplace_back(size_t(x.numel()), 0.0);  // no path from this input: the gradient is zero
      continue;
    }
    if (g.shape() != x.shape() || g.dtype() != x.dtype())
      return AssertionFailure() << "gradcheck: gradient of input " << k << " is " << g.describe() << ", input is "
                                << x.describe();
    analytic.push_back(g.to_vector<double>());
    ag::set_grad(x, Tensor());
  }
  out = Tensor();

  // ---- numeric: central differences, perturbing through each input's view ----
  auto loss_at = [&] {
    NoGradGuard no_grad;
    Tensor o = f(inputs);
    LOOM_CHECK(o.shape() == R.shape(), "gradcheck: f returned ", o.shape(), " after ", R.shape());
    return detail::weighted_sum(o, r);
  };
  for (size_t c = 0; c < checked.size(); ++c) {
    size_t k = checked[c];
    const Tensor& x = inputs[k];
    double* base = x.data<double>();
    int64_t n = x.numel(), bad = 0, worst = -1;
    double worst_ratio = 0, worst_numeric = 0;
    for (int64_t i = 0; i < n; ++i) {
      Shape idx = detail::unravel(i, x.shape());
      double* p = base + detail::strided_offset(idx, x.strides());
      const double orig = *p;
      *p = orig + opt.eps;
      double lp = loss_at();
      *p = orig - opt.eps;
      double lm = loss_at();
      *p = orig;
      double numeric = (lp - lm) / (2 * opt.eps);
      double diff = std::abs(analytic[c][size_t(i)] - numeric);
      double ratio = diff / (opt.atol + opt.rtol * std::abs(numeric));
      if (!(ratio <= 1.0)) ++bad;  // NaN counts as a failure
      if (!(ratio <= worst_ratio) || worst < 0) {
        worst_ratio = ratio;
        worst = i;
        worst_numeric = numeric;
      }
    }
    if (bad > 0) {
      double a = analytic[c][size_t(worst)];
      return AssertionFailure() << "gradcheck: input " << k << " " << x.describe() << " (strides "
                                << shape_str(x.strides()) << "): " << bad << " of " << n
                                << " elements outside tolerance; worst at index "
                                << shape_str(detail::unravel(worst, x.shape())) << ": analytic " << detail::fmt(a)
                                << ", numeric " << detail::fmt(worst_numeric) << ", |diff| "
                                << detail::fmt(std::abs(a - worst_numeric)) << " > "
                                << detail::fmt(opt.atol + opt.rtol * std::abs(worst_numeric));
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace loom::test
