// Attention tests' inputs and runs: q, k, v [B, H, T, hd] as autograd leaves,
// dense or as the attention module makes them (views of one projection
// output), and one path's output and gradients, for the tests that compare
// attention paths (test_attention, test_flash_attention).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/variable.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

#include "relative_error.h"

namespace loom::test {

struct Qkv {
  Tensor q, k, v;
  Tensor qkv;  // strided: the [B, T, 3 H hd] leaf q, k, v are views of (undefined when dense)
};

// q, k, v [B, H, T, hd] as leaves. strided: views of one [B, T, 3 H hd]
// tensor, split and transposed as the attention module does; else dense.
inline Qkv make_qkv(int64_t B, int64_t H, int64_t T, int64_t hd, DType dtype, bool strided, uint64_t seed) {
  Generator g(seed);
  if (!strided) {
    auto leaf = [&] { return autograd::set_requires_grad(randn({B, H, T, hd}, g, dtype)); };
    Tensor q = leaf(), k = leaf(), v = leaf();
    return {q, k, v, Tensor()};
  }
  Tensor qkv = autograd::set_requires_grad(randn({B, T, 3 * H * hd}, g, dtype));
  autograd::TensorList parts = autograd::split(qkv, H * hd, 2);
  auto heads = [&](const Tensor& t) { return autograd::transpose(autograd::reshape(t, {B, T, H, hd}), 1, 2); };
  return {heads(parts[0]), heads(parts[1]), heads(parts[2]), qkv};
}

// An attention path: q, k, v [B, H, T, hd] and the scale -> out [B, H, T, hd].
using AttentionPath = std::function<Tensor(const Tensor&, const Tensor&, const Tensor&, double)>;

struct Outputs {
  Tensor out, dq, dk, dv;  // contiguous
};

// out and the gradients of sum(out * w) for a fixed random w (from `seed`), by one path.
inline Outputs run_attention(const Qkv& in, const AttentionPath& path, uint64_t seed) {
  const double scale = 1.0 / std::sqrt(double(in.q.size(3)));
  for (const Tensor* t : {&in.q, &in.k, &in.v})
    if (!autograd::is_leaf(*t)) autograd::retain_grad(*t);
  Tensor out = path(in.q, in.k, in.v, scale);
  Generator g(seed);
  Tensor w = randn(out.shape(), g, out.dtype());
  autograd::backward(autograd::sum(autograd::mul(out, w)));
  return {ops::contiguous(out), ops::contiguous(autograd::grad(in.q)), ops::contiguous(autograd::grad(in.k)),
          ops::contiguous(autograd::grad(in.v))};
}

// Two paths' outputs and gradients agree within tol (relative_error: max |got - ref| / max |ref|).
inline void expect_outputs_match(const Outputs& got, const Outputs& ref, double tol) {
  EXPECT_LE(relative_error(got.out, ref.out), tol) << "out";
  EXPECT_LE(relative_error(got.dq, ref.dq), tol) << "dq";
  EXPECT_LE(relative_error(got.dk, ref.dk), tol) << "dk";
  EXPECT_LE(relative_error(got.dv, ref.dv), tol) << "dv";
}

}  // namespace loom::test
