// Differentiable ops: the raw ops of tensor/ops.h plus a recorded backward.
// This is the API models are written in:
//   using namespace loom::autograd;
//   Tensor y = gelu(matmul(x, w) + b);
// Shapes follow PyTorch; every backward is gradient-checked in tests/.
#pragma once

#include <vector>

#include "autograd/variable.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

namespace loom::autograd {

// ---- arithmetic (numpy broadcasting) --------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor pow(const Tensor& x, double p);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);  // tanh approximation
Tensor silu(const Tensor& x);  // x sigmoid(x), Llama's SwiGLU gate

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double s) { return add(a, s); }
inline Tensor operator+(double s, const Tensor& a) { return add(a, s); }
inline Tensor operator-(const Tensor& a, double s) { return add(a, -s); }
inline Tensor operator-(double s, const Tensor& a) { return add(neg(a), s); }
inline Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
inline Tensor operator*(double s, const Tensor& a) { return mul(a, s); }
inline Tensor operator/(const Tensor& a, double s) { return mul(a, 1.0 / s); }
inline Tensor operator-(const Tensor& x) { return neg(x); }

// ---- reductions ------------------------------------------------------------------
Tensor sum(const Tensor& x);
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor max(const Tensor& x, int64_t dim, bool keepdim = false);  // values; grad flows to the argmax
Tensor max(const Tensor& x);

// ---- linear algebra --------------------------------------------------------------
Tensor matmul(const Tensor& a, const Tensor& b);  // [..., M, K] @ [..., K, N]
// x @ weightᵀ + bias (bias may be undefined), one fused op: x [..., in], weight [out, in] -> [..., out]
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);
// gelu(linear(x, weight, bias)) with one forward (ops::linear_gelu: one cuBLASLt
// call under fast kernels) and the two ops' backward nodes, so the graph, what
// it keeps (x, and h for gelu) and every gradient are the composition's.
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias);

// ---- views and copies ------------------------------------------------------------
Tensor view(const Tensor& x, const Shape& shape);
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor expand(const Tensor& x, const Shape& shape);
Tensor contiguous(const Tensor& x);
Tensor clone(const Tensor& x);
Tensor to(const Tensor& x, DType dtype);  // gradient converted back to x's dtype

Tensor cat(const TensorList& xs, int64_t dim);
TensorList split(const Tensor& x, int64_t split_size, int64_t dim);
Tensor stack(const TensorList& xs, int64_t dim);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& idx);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& idx);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
// x: [..., T, S]; entries with column > row become value (their gradient is 0).
Tensor causal_mask_fill(const Tensor& x, double value);

// ---- neural-net ops ----------------------------------------------------------------
Tensor softmax(const Tensor& x);      // last dim
// Causal attention's softmax, fused: softmax(causal_mask_fill(x * scale, -inf)) in one
// pass over the [..., T, S] scores (row t sees columns 0..t). Same numbers as the three ops.
Tensor causal_softmax(const Tensor& x, double scale);
// matmul(causal_softmax(matmul(q, kᵀ), scale), v) as one op, masked blocks
// skipped (ops::causal_attention): q, k, v [B, H, T, hd] float32/float64 on
// the CPU. nn/attention.h picks it or the composition.
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale);
Tensor log_softmax(const Tensor& x);  // last dim
// x: [..., C], weight/bias: [C] (may be undefined). Fused; saves mean/rstd.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
// RMSNorm: x: [..., C], weight: [C] (may be undefined). Fused; saves rstd.
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-5);
// Rotary position embeddings (Llama's rotate-half layout): x [..., T, hd], row t
// at position pos0 + t, rotated by base^(-2i/hd) per position. No parameters.
Tensor rope(const Tensor& x, double base = 10000.0, int64_t pos0 = 0);
// weight: [V, C], idx: int tensor of any shape -> [..., C]
Tensor embedding(const Tensor& weight, const Tensor& idx);
// logits: [N, V], targets: [N] -> mean loss over targets != ignore_index
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);
// Inverted dropout; identity when !training or p == 0.
Tensor dropout(const Tensor& x, double p, PhiloxGenerator& gen, bool training = true);

}  // namespace loom::autograd
