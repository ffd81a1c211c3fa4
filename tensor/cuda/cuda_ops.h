// Internal to tensor/ (and optim/, for the optimizer math at the end): the
// CUDA side of every op that has one. tensor/ops_*.cpp check shapes and
// dtypes, then hand a tensor on a GPU to these functions
// (`if (x.device().is_cuda()) return cuda::softmax(x);`); they enqueue work on
// the device's stream and return without waiting for it.
//
// Declared in every build: without CUDA (cuda/unavailable.cpp) they throw, and
// are never reached, since no CUDA tensor can be made there. An op with no
// entry here throws "not implemented on CUDA yet: <op>" (check_device_supported).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "tensor/kernels/adamw.h"
#include "tensor/ops.h"

namespace loom::cuda {

// ---- copies (transfer.cpp: across devices; copy.cu: on one device) -------------
// dst <- src broadcast and dtype-converted; either may be on the CPU. A copy
// to the CPU waits for the stream (the value must reach the host).
void copy_(const Tensor& dst, const Tensor& src);
void copy_on_device(const Tensor& dst, const Tensor& src);  // both on the same GPU
void fill_(const Tensor& t, double value);
void zero_(const Tensor& t);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, const Shape& shape);

// ---- elementwise (elementwise.cu) ---------------------------------------------
// The scalar `s` is the op's constant: x + s, x * s, s - x, s / x, x^s, x > s.
enum class Unary : uint8_t { AddScalar, MulScalar, RSub, RDiv, Neg, Exp, Log, Tanh, Sqrt, Pow, Square, Relu, Gelu, Gt, Silu };
enum class Binary : uint8_t { Add, Sub, Mul, Div, GeluBackward, SiluBackward };
Tensor unary(Unary op, const Tensor& x, double s = 0);
Tensor binary(Binary op, const Tensor& a, const Tensor& b);  // broadcast, same dtype and device
void mul_(const Tensor& dst, double s);
void add_(const Tensor& dst, const Tensor& src, double alpha);  // dst += alpha * src (src broadcast)

// ---- reductions (reduce.cu) -----------------------------------------------------
// x summed over the dims marked in `reduced`, in double: float64 of x's shape
// with reduced dims of size 1 (what ops_reduce.cpp's sum_in_double gives on CPU).
Tensor sum_in_double(const Tensor& x, const std::vector<bool>& reduced);
// rows: contiguous [R, n] -> values [R] (rows' dtype), indices [R] int64 of the first max.
void max_rows(const Tensor& rows, const Tensor& values, const Tensor& indices);

// ---- GEMM through cuBLAS (gemm.cpp) ---------------------------------------------
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b);
ops::LinearGeluResult linear_gelu(const Tensor& x, const Tensor& w, const Tensor& b);
ops::LinearGrads linear_backward(const Tensor& grad, const Tensor& x, const Tensor& w, bool need_x, bool need_w,
                                 bool need_b);

// ---- per-row kernels from tensor/kernels/ (rows.cu) -------------------------------
Tensor softmax(const Tensor& x);
Tensor log_softmax(const Tensor& x);
Tensor softmax_backward(const Tensor& grad, const Tensor& y);
Tensor log_softmax_backward(const Tensor& grad, const Tensor& y);
Tensor causal_softmax(const Tensor& x, double scale);
Tensor causal_softmax_backward(const Tensor& grad, const Tensor& y, double scale);
ops::LayerNormResult layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
ops::LayerNormGrads layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                        const Tensor& rstd);
ops::RMSNormResult rms_norm(const Tensor& x, const Tensor& weight, double eps);
ops::RMSNormGrads rms_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight, const Tensor& rstd);
// cos, sin: [P, hd/2] in x's compute dtype on x's device, row p for position pos0 + p (ops::rope fills them).
Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse);

// ---- embedding and cross-entropy (embedding.cu) ---------------------------------
Tensor embedding(const Tensor& weight, const Tensor& idx);
Tensor embedding_backward(const Tensor& grad, const Tensor& idx, int64_t num_rows);
ops::CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index);
Tensor cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              int64_t count, int64_t ignore_index);

// ---- indexing (index.cu); dims wrapped and shapes checked by ops_index.cpp -------------
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& idx);
Tensor index_add(const Tensor& like, int64_t dim, const Tensor& idx, const Tensor& src);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& idx);
Tensor scatter_add(const Shape& shape, int64_t dim, const Tensor& idx, const Tensor& src);

// ---- dropout (dropout.cu) ------------------------------------------------------------
// mask (contiguous, floating) <- scale where Philox's word for (seed, offset, i)
// is >= threshold, else 0 (tensor/kernels/philox.h; the CPU loop is ops_dropout.cpp).
void dropout_mask(const Tensor& mask, uint64_t seed, uint64_t offset, uint32_t threshold, double scale);

// ---- optimizer math (optim.cu), called by optim/ ------------------------------------
// p (fp32/bf16/fp16 with fp32 state, or float64 with float64 state) updated in
// place with its moments m, v from gradient g: tensor/kernels/adamw.h per element.
void adamw_update(const Tensor& p, const Tensor& m, const Tensor& v, const Tensor& g,
                  const kernels::AdamWScalars<float>& s);
void adamw_update(const Tensor& p, const Tensor& m, const Tensor& v, const Tensor& g,
                  const kernels::AdamWScalars<double>& s);
// Every grad (contiguous fp32, one GPU) times inv_scale; true when any held an inf or nan.
bool unscale_(const std::vector<Tensor>& grads, double inv_scale);

}  // namespace loom::cuda
