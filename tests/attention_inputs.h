// Attention test inputs: q, k, v [B, H, T, hd] as autograd leaves, dense or
// as the attention module makes them (views of one projection output), for
// the tests that compare attention paths (test_attention, test_flash_attention).
#pragma once

#include <cstdint>

#include "autograd/functions.h"
#include "autograd/variable.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

namespace loom::test {

struct Qkv {
  Tensor q, k, v;
};

// q, k, v [B, H, T, hd] as leaves. strided: views of one [B, T, 3 H hd]
// tensor, split and transposed as the attention module does; else dense.
inline Qkv make_qkv(int64_t B, int64_t H, int64_t T, int64_t hd, DType dtype, bool strided, uint64_t seed) {
  Generator g(seed);
  if (!strided) {
    auto leaf = [&] { return autograd::set_requires_grad(randn({B, H, T, hd}, g, dtype)); };
    Tensor q = leaf(), k = leaf(), v = leaf();
    return {q, k, v};
  }
  Tensor qkv = autograd::set_requires_grad(randn({B, T, 3 * H * hd}, g, dtype));
  autograd::TensorList parts = autograd::split(qkv, H * hd, 2);
  auto heads = [&](const Tensor& t) { return autograd::transpose(autograd::reshape(t, {B, T, H, hd}), 1, 2); };
  return {heads(parts[0]), heads(parts[1]), heads(parts[2])};
}

}  // namespace loom::test
