// Backward formulas of the fused neural-net ops (kernels in tensor/kernels/).
#include "autograd/function.h"
#include "autograd/functions.h"

namespace loom::autograd {

// Separable (zero-bubble's B/W split, engine.h): dx = dY W needs W, dW = dYᵀ X
// and db = Σ dY need X; neither needs the other. out: ops::linear's result.
static Tensor record_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor out) {
  const bool need_x = requires_grad(x), need_w = requires_grad(weight);
  const bool need_b = bias.defined() && requires_grad(bias);
  return record_split(
      "LinearBackward", {&x}, {&weight, &bias}, std::move(out),
      [x, weight, need_x](const TensorList& g) {
        return TensorList{ops::linear_backward(g[0], x, weight, need_x, false, false).dx};
      },
      [x, weight, need_w, need_b](const TensorList& g) {
        ops::LinearGrads d = ops::linear_backward(g[0], x, weight, false, need_w, need_b);
        return TensorList{d.dw, d.db};
      });
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return record_linear(x, weight, bias, ops::linear(x, weight, bias));
}

// The forward fused, the backward not: h is recorded as linear's output and
// y as gelu's (the node autograd::gelu records), so backward runs
// gelu_backward, then linear's B and W, as for gelu(linear(x, weight, bias)).
// x: [..., in], weight: [F, in] -> [..., F]
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  ops::LinearGeluResult r = ops::linear_gelu(x, weight, bias);
  Tensor h = record_linear(x, weight, bias, r.h);
  return record("GeluBackward", {&h}, r.y,
                [h](const TensorList& g) { return TensorList{ops::gelu_backward(g[0], h)}; });
}

Tensor softmax(const Tensor& x) {
  Tensor y = ops::softmax(x);
  return record("SoftmaxBackward", {&x}, y, [y = y.alias()](const TensorList& g) {
    return TensorList{ops::softmax_backward(g[0], y)};
  });
}

Tensor causal_softmax(const Tensor& x, double scale) {
  Tensor y = ops::causal_softmax(x, scale);
  return record("CausalSoftmaxBackward", {&x}, y, [y = y.alias(), scale](const TensorList& g) {
    return TensorList{ops::causal_softmax_backward(g[0], y, scale)};
  });
}

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  ops::CausalAttentionResult r = ops::causal_attention(q, k, v, scale);
  return record("CausalAttentionBackward", {&q, &k, &v}, r.y, [q, k, v, att = r.att, scale](const TensorList& g) {
    ops::CausalAttentionGrads d = ops::causal_attention_backward(g[0], q, k, v, att, scale);
    return TensorList{d.dq, d.dk, d.dv};
  });
}

Tensor log_softmax(const Tensor& x) {
  Tensor y = ops::log_softmax(x);
  return record("LogSoftmaxBackward", {&x}, y, [y = y.alias()](const TensorList& g) {
    return TensorList{ops::log_softmax_backward(g[0], y)};
  });
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  ops::LayerNormResult r = ops::layer_norm(x, weight, bias, eps);
  return record("LayerNormBackward", {&x, &weight, &bias}, r.y,
                [x, weight, has_bias = bias.defined(), mean = r.mean, rstd = r.rstd](const TensorList& g) {
                  ops::LayerNormGrads d = ops::layer_norm_backward(g[0], x, weight, mean, rstd);
                  return TensorList{d.dx, weight.defined() ? d.dweight : Tensor(), has_bias ? d.dbias : Tensor()};
                });
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  ops::RMSNormResult r = ops::rms_norm(x, weight, eps);
  return record("RMSNormBackward", {&x, &weight}, r.y, [x, weight, rstd = r.rstd](const TensorList& g) {
    ops::RMSNormGrads d = ops::rms_norm_backward(g[0], x, weight, rstd);
    return TensorList{d.dx, weight.defined() ? d.dweight : Tensor()};
  });
}

// A rotation by each position's angles; its backward rotates the gradient back.
Tensor rope(const Tensor& x, double base, int64_t pos0) {
  return record("RoPEBackward", {&x}, ops::rope(x, base, pos0), [base, pos0](const TensorList& g) {
    return TensorList{ops::rope(g[0], base, pos0, /*inverse=*/true)};
  });
}

// The weight is the only edge: its whole backward can wait for W.
Tensor embedding(const Tensor& weight, const Tensor& idx) {
  return record_split(
      "EmbeddingBackward", {}, {&weight}, ops::embedding(weight, idx), [](const TensorList&) { return TensorList{}; },
      [idx, v = weight.size(0)](const TensorList& g) { return TensorList{ops::embedding_backward(g[0], idx, v)}; });
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  ops::CrossEntropyResult r = ops::cross_entropy(logits, targets, ignore_index);
  return record("CrossEntropyBackward", {&logits}, r.loss,
                [logits, targets, lse = r.lse, count = r.count, ignore_index](const TensorList& g) {
                  return TensorList{ops::cross_entropy_backward(g[0], logits, targets, lse, count, ignore_index)};
                });
}

Tensor dropout(const Tensor& x, double p, PhiloxGenerator& gen, bool training) {
  if (!training || p == 0.0) return x;
  auto [y, mask] = ops::dropout(x, p, gen);
  return record("DropoutBackward", {&x}, y,
                [mask = mask](const TensorList& g) { return TensorList{ops::mul(g[0], mask)}; });
}

}  // namespace loom::autograd
