// Backward formulas of the arithmetic ops, reductions and matmul.
// Broadcast inputs get their gradient summed back to their own shape (sum_to).
#include <algorithm>
#include <cmath>

#include "autograd/function.h"
#include "autograd/functions.h"

namespace loom::autograd {

using ops::sum_to;

Tensor add(const Tensor& a, const Tensor& b) {
  return record("AddBackward", {&a, &b}, ops::add(a, b), [sa = a.shape(), sb = b.shape()](const TensorList& g) {
    return TensorList{sum_to(g[0], sa), sum_to(g[0], sb)};
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  return record("SubBackward", {&a, &b}, ops::sub(a, b), [sa = a.shape(), sb = b.shape()](const TensorList& g) {
    return TensorList{sum_to(g[0], sa), sum_to(ops::neg(g[0]), sb)};
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  return record("MulBackward", {&a, &b}, ops::mul(a, b), [a, b](const TensorList& g) {
    return TensorList{requires_grad(a) ? sum_to(ops::mul(g[0], b), a.shape()) : Tensor(),
                      requires_grad(b) ? sum_to(ops::mul(g[0], a), b.shape()) : Tensor()};
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  return record("DivBackward", {&a, &b}, ops::div(a, b), [a, b](const TensorList& g) {
    // d(a/b)/da = 1/b, d(a/b)/db = -a/b^2
    Tensor ga = ops::div(g[0], b);
    Tensor gb = ops::neg(ops::div(ops::mul(ga, a), b));
    return TensorList{sum_to(ga, a.shape()), sum_to(gb, b.shape())};
  });
}

Tensor add(const Tensor& a, double s) {
  return record("AddScalarBackward", {&a}, ops::add(a, s), [](const TensorList& g) { return TensorList{g[0]}; });
}

Tensor mul(const Tensor& a, double s) {
  return record("MulScalarBackward", {&a}, ops::mul(a, s), [s](const TensorList& g) {
    return TensorList{ops::mul(g[0], s)};
  });
}

Tensor neg(const Tensor& x) {
  return record("NegBackward", {&x}, ops::neg(x), [](const TensorList& g) { return TensorList{ops::neg(g[0])}; });
}

Tensor exp(const Tensor& x) {
  Tensor y = ops::exp(x);
  return record("ExpBackward", {&x}, y, [y = y.alias()](const TensorList& g) { return TensorList{ops::mul(g[0], y)}; });
}

Tensor log(const Tensor& x) {
  return record("LogBackward", {&x}, ops::log(x), [x](const TensorList& g) { return TensorList{ops::div(g[0], x)}; });
}

Tensor tanh(const Tensor& x) {
  Tensor y = ops::tanh(x);
  return record("TanhBackward", {&x}, y, [y = y.alias()](const TensorList& g) {
    return TensorList{ops::mul(g[0], ops::rsub(1.0, ops::mul(y, y)))};  // 1 - tanh^2
  });
}

Tensor sqrt(const Tensor& x) {
  Tensor y = ops::sqrt(x);
  return record("SqrtBackward", {&x}, y, [y = y.alias()](const TensorList& g) {
    return TensorList{ops::div(ops::mul(g[0], 0.5), y)};
  });
}

Tensor pow(const Tensor& x, double p) {
  return record("PowBackward", {&x}, ops::pow(x, p), [x, p](const TensorList& g) {
    return TensorList{ops::mul(ops::mul(g[0], ops::pow(x, p - 1.0)), p)};
  });
}

Tensor relu(const Tensor& x) {
  return record("ReluBackward", {&x}, ops::relu(x), [x](const TensorList& g) {
    return TensorList{ops::mul(g[0], ops::gt_scalar(x, 0.0))};
  });
}

Tensor gelu(const Tensor& x) {
  return record("GeluBackward", {&x}, ops::gelu(x), [x](const TensorList& g) {
    return TensorList{ops::gelu_backward(g[0], x)};
  });
}

Tensor silu(const Tensor& x) {
  return record("SiluBackward", {&x}, ops::silu(x), [x](const TensorList& g) {
    return TensorList{ops::silu_backward(g[0], x)};
  });
}

// ---- reductions ------------------------------------------------------------------

Tensor sum(const Tensor& x) {
  return record("SumBackward", {&x}, ops::sum(x), [shape = x.shape()](const TensorList& g) {
    return TensorList{ops::expand(g[0], shape)};
  });
}

// Re-inserts the reduced dims (size 1) so the gradient broadcasts over them.
static Tensor unreduce(const Tensor& g, const Shape& in_shape, std::vector<int64_t> dims, bool keepdim) {
  Tensor k = g;
  if (!keepdim) {
    for (int64_t& d : dims) if (d < 0) d += int64_t(in_shape.size());
    std::sort(dims.begin(), dims.end());
    for (int64_t d : dims) k = ops::unsqueeze(k, d);
  }
  return ops::expand(k, in_shape);
}

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return record("SumBackward", {&x}, ops::sum(x, dims, keepdim), [shape = x.shape(), dims, keepdim](const TensorList& g) {
    return TensorList{unreduce(g[0], shape, dims, keepdim)};
  });
}

Tensor mean(const Tensor& x) { return mul(sum(x), 1.0 / double(x.numel())); }

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  int64_t count = 1;
  for (int64_t d : dims) count *= x.size(d);
  return mul(sum(x, dims, keepdim), 1.0 / double(count));
}

Tensor max(const Tensor& x, int64_t dim, bool keepdim) {
  auto [values, indices] = ops::max(x, dim, keepdim);
  return record("MaxBackward", {&x}, values, [shape = x.shape(), dim, keepdim, indices = indices](const TensorList& g) {
    int64_t d = dim < 0 ? dim + int64_t(shape.size()) : dim;
    Tensor gk = keepdim ? g[0] : ops::unsqueeze(g[0], d);
    Tensor ik = keepdim ? indices : ops::unsqueeze(indices, d);
    return TensorList{ops::scatter_add(shape, d, ik, gk)};
  });
}

Tensor max(const Tensor& x) {
  Tensor flat = reshape(x, {-1});
  return reshape(max(flat, 0, false), {});
}

// ---- matmul ------------------------------------------------------------------------

// True when t's matrices are stored column by column: a transposed view such as
// attention's kᵀ (stride 1 down a column, not along a row).
static bool column_major(const Tensor& t) {
  return t.dim() >= 2 && t.size(-2) > 1 && t.size(-1) > 1 && t.stride(-2) == 1 && t.stride(-1) != 1;
}

// ga = g @ bᵀ and gb = aᵀ @ g. The gradient of an operand stored transposed
// is computed transposed (gb as (gᵀ @ a)ᵀ, ga as (b @ gᵀ)ᵀ) so that it comes
// out in the operand's own layout, as PyTorch's mm_mat2_backward does. In
// attention's q @ kᵀ, b = kᵀ: as aᵀ @ g, dk would sit in memory as [B, H, hd, T],
// and the reshape that merges the heads back into [B, T, C] would gather it
// one element at a time, T apart; as (gᵀ @ a)ᵀ it is [B, H, T, hd] rows and
// that copy moves whole rows. Each element is the same sum either way (with
// OpenBLAS the small GPT's losses and weights come out bit for bit the same).
Tensor matmul(const Tensor& a, const Tensor& b) {
  return record("MatmulBackward", {&a, &b}, ops::matmul(a, b), [a, b](const TensorList& g) {
    using ops::transpose;
    Tensor ga, gb;
    if (requires_grad(a)) {
      ga = column_major(a) ? transpose(ops::matmul(b, transpose(g[0], -1, -2)), -1, -2)
                           : ops::matmul(g[0], transpose(b, -1, -2));
      ga = sum_to(ga, a.shape());
    }
    if (requires_grad(b)) {
      if (b.dim() == 2 && a.dim() > 2) {
        // [..., M, K] @ [K, N]: fold batch dims so dW is one GEMM: [K, B*M] @ [B*M, N].
        Tensor a2 = ops::reshape(a, {-1, a.size(-1)});
        Tensor g2 = ops::reshape(g[0], {-1, g[0].size(-1)});
        gb = ops::matmul(transpose(a2, 0, 1), g2);
      } else {
        gb = column_major(b) ? transpose(ops::matmul(transpose(g[0], -1, -2), a), -1, -2)
                             : ops::matmul(transpose(a, -1, -2), g[0]);
        gb = sum_to(gb, b.shape());
      }
    }
    return TensorList{ga, gb};
  });
}

}  // namespace loom::autograd
