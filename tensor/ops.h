// Raw tensor ops: CPU math with no autograd. Differentiable versions that
// record graph nodes live in autograd/functions.h and call these.
//
// Conventions: float ops compute in fp32 (float64 tensors in double); bf16 and
// fp16 inputs are converted in and the result is rounded out to the input
// dtype. Binary ops broadcast numpy-style and require equal dtypes. Errors name
// the op and the shapes/dtypes involved.
#pragma once

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tensor/generator.h"
#include "tensor/kernels/adamw.h"
#include "tensor/tensor.h"

namespace loom::ops {

// ---- copies and conversion ----------------------------------------------------
Tensor to(const Tensor& x, DType dtype);     // returns x itself when dtype matches
// To another device (cpu <-> cuda:N, cuda:M <-> cuda:N), optionally converting
// the dtype; x itself when nothing changes. A copy to the CPU waits for the GPU.
Tensor to(const Tensor& x, const Device& device);
Tensor to(const Tensor& x, const Device& device, DType dtype);
Tensor contiguous(const Tensor& x);          // returns x itself when already contiguous
Tensor clone(const Tensor& x);               // always a fresh contiguous copy
void copy_(const Tensor& dst, const Tensor& src);  // src broadcast into dst, dtype converted
void fill_(const Tensor& t, double value);
void zero_(const Tensor& t);
// t's TensorImpl takes over src's storage, shape, strides, offset and dtype
// (PyTorch's `param.data = src`): every handle on t - the module's, the
// optimizer's, autograd's - sees the new data. How a model's params are cast to
// bf16 in place (Module::to) and become views into the distributed optimizer's
// param buffer. Not while t is part of a recorded graph.
void set_data(const Tensor& t, const Tensor& src);

// ---- views (share storage) ----------------------------------------------------
Tensor view(const Tensor& x, Shape shape);      // one -1 allowed; error if strides forbid
Tensor reshape(const Tensor& x, Shape shape);   // a view when possible, else a copy
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x);                // every size-1 dim
Tensor expand(const Tensor& x, const Shape& shape);  // -1 keeps a size
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);

// ---- elementwise ------------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor rsub(double s, const Tensor& a);  // s - a
Tensor rdiv(double s, const Tensor& a);  // s / a
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor pow(const Tensor& x, double p);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);                           // tanh approximation (GPT-2)
Tensor gelu_backward(const Tensor& grad, const Tensor& x);
Tensor silu(const Tensor& x);                           // x sigmoid(x) (Llama's SwiGLU gate)
Tensor silu_backward(const Tensor& grad, const Tensor& x);
Tensor gt_scalar(const Tensor& x, double s);            // 1 where x > s else 0, x's dtype
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);  // cond != 0 ? a : b
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);  // mask != 0 -> value
// x: [..., T, S]; positions with column > row are set to value (causal attention).
Tensor causal_mask_fill(const Tensor& x, double value);

// In place (dst must not be a leaf that requires grad while grad mode is on).
void add_(const Tensor& dst, const Tensor& src, double alpha = 1.0);  // dst += alpha * src
void mul_(const Tensor& dst, double s);

// ---- reductions ---------------------------------------------------------------
Tensor sum(const Tensor& x);  // all elements -> shape []
Tensor sum(const Tensor& x, std::vector<int64_t> dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, std::vector<int64_t> dims, bool keepdim = false);
// Max over one dim: (values, int64 indices of the first max).
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor max(const Tensor& x);  // all elements -> shape []
// Sums a broadcast result back down to `shape` (the gradient of expand).
Tensor sum_to(const Tensor& x, const Shape& shape);

// ---- linear algebra -----------------------------------------------------------
// [M, K] @ [K, N] -> [M, N]; batch dims broadcast: [..., M, K] @ [..., K, N].
Tensor matmul(const Tensor& a, const Tensor& b);

// The Linear layer in one op (PyTorch's F.linear): y = x @ wᵀ + b.
// x: [..., K], w: [N, K], b: [N] or undefined -> [..., N]. fp32/fp64: the bias
// goes onto each row right after the GEMM (beta = 0); bf16: it is the GEMM's
// starting value (BLAS beta = 1). Either way one output, no second tensor.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b);
struct LinearGrads { Tensor dx, dw, db; };  // dw: [N, K] like w; db: [N]; undefined unless asked for
LinearGrads linear_backward(const Tensor& grad, const Tensor& x, const Tensor& w, bool need_x, bool need_w,
                            bool need_b);
// gelu(linear(x, w, b)), the GPT-2 MLP's c_fc and its activation, keeping the
// pre-activation h = x @ wᵀ + b that gelu_backward needs: y = gelu(h), both
// [..., N]. On the CPU (and the reference CUDA path, and fp32) the two ops
// themselves; under LOOM_CUDA_KERNELS=fast, bf16/fp16, one cuBLASLt call
// (tensor/cuda/fast/gemm_lt.h). Its backward: gelu_backward, then linear_backward.
struct LinearGeluResult { Tensor h, y; };
LinearGeluResult linear_gelu(const Tensor& x, const Tensor& w, const Tensor& b);

// ---- neural-net ops (fused, per-row kernels in tensor/kernels/) ---------------------
Tensor softmax(const Tensor& x);                 // over the last dim
Tensor log_softmax(const Tensor& x);
Tensor softmax_backward(const Tensor& grad, const Tensor& y);       // y = softmax(x)
Tensor log_softmax_backward(const Tensor& grad, const Tensor& y);   // y = log_softmax(x)
// Causal attention's softmax in one pass: softmax(causal_mask_fill(x * scale, -inf)).
// x: [..., T, S] scores; row t sees columns 0..t; hidden entries of y are 0.
Tensor causal_softmax(const Tensor& x, double scale);
Tensor causal_softmax_backward(const Tensor& grad, const Tensor& y, double scale);  // y = causal_softmax(x, scale)

// Causal attention as one op on the CPU (tensor/ops_attention.cpp), skipping
// the masked blocks of q kᵀ and att @ v: the fast twin of
//   att = causal_softmax(q @ kᵀ, scale);  y = att @ v
// q, k, v: [B, H, T, hd] float32/float64 on the CPU (any strides with a
// contiguous last dim). y: [B, H, T, hd], stored with heads merged
// ([B, T, H, hd] in memory); att: [B, H, T, T], zeros past the diagonal,
// saved for backward. dq, dk, dv are stored like y.
struct CausalAttentionResult { Tensor y, att; };
CausalAttentionResult causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale);
struct CausalAttentionGrads { Tensor dq, dk, dv; };
CausalAttentionGrads causal_attention_backward(const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v,
                                               const Tensor& att, double scale);

struct LayerNormResult { Tensor y, mean, rstd; };  // mean, rstd: [rows] float32/float64
// x: [..., C], weight/bias: [C] (either may be undefined).
LayerNormResult layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
struct LayerNormGrads { Tensor dx, dweight, dbias; };
LayerNormGrads layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight,
                                   const Tensor& mean, const Tensor& rstd);

// RMSNorm (tensor/ops_llama.cpp): x: [..., C], weight: [C] (may be undefined); rstd: [rows].
struct RMSNormResult { Tensor y, rstd; };
RMSNormResult rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-5);
struct RMSNormGrads { Tensor dx, dweight; };
RMSNormGrads rms_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight, const Tensor& rstd);

// Rotary position embeddings, Llama's rotate-half layout (tensor/kernels/rope.h):
// x: [..., T, hd] (hd even), row t of each [T, hd] block at position pos0 + t,
// rotated by (pos0 + t) θ_i, θ_i = base^(-2i/hd). inverse rotates the other
// way: the backward of rope (the rotation is orthogonal).
Tensor rope(const Tensor& x, double base, int64_t pos0 = 0, bool inverse = false);

// weight: [V, C], idx: any shape of int32/int64 -> [..., C]
Tensor embedding(const Tensor& weight, const Tensor& idx);
// grad: [..., C] -> [V, C], rows summed for repeated indices
Tensor embedding_backward(const Tensor& grad, const Tensor& idx, int64_t num_rows);

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& idx);  // idx: 1-D
Tensor index_add(const Tensor& x_shape_like, int64_t dim, const Tensor& idx, const Tensor& src);  // zeros + scatter
// out[..i.., j, ..k..] = x[..i.., idx[..i.., j, ..k..], ..k..]; idx same rank as x.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& idx);
Tensor scatter_add(const Shape& shape, int64_t dim, const Tensor& idx, const Tensor& src);

Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
// The view of one storage that cat(xs, dim) would equal, when xs already sit
// side by side there along dim (the same strides, each starting where the one
// before ends, the whole not overlapping itself); an undefined Tensor when not.
// split's backward uses it: attention writes dq, dk, dv into one buffer laid
// out as qkv, so qkv's gradient needs no copy.
Tensor cat_view(const std::vector<Tensor>& xs, int64_t dim);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim);  // views
Tensor stack(const std::vector<Tensor>& xs, int64_t dim);

// Fused log-softmax + NLL (tensor/ops_loss.cpp). logits: [N, V] float, targets: [N] int32/int64.
// Returns (loss [] = mean over non-ignored rows, lse [N] saved for backward, count).
struct CrossEntropyResult { Tensor loss, lse; int64_t count; };
CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);
// d loss / d logits, times grad (a scalar): (softmax - onehot) * grad / count.
Tensor cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& targets,
                              const Tensor& lse, int64_t count, int64_t ignore_index = -100);

// Inverted dropout (tensor/ops_dropout.cpp): returns (y, scale mask) with
// mask = keep / (1 - p), drawn by Philox at (gen.seed, gen.next_offset()).
std::pair<Tensor, Tensor> dropout(const Tensor& x, double p, PhiloxGenerator& gen);
// The scale mask of one call: element i is 1 / (1 - p) when Philox's word for
// (seed, offset, i) keeps it, else 0; the same bits on every device and thread count.
Tensor dropout_mask(const Shape& shape, DType dtype, const Device& device, double p, uint64_t seed,
                    uint64_t offset);

// ---- the optimizer's element math (ops_optim.cpp; tensor/kernels/adamw.h, unscale.h) ----
// One AdamW step in place: param p (fp32, bf16 or fp16; fp64 with the double
// scalars) and its moments m, v from gradient g (m, v, g in the compute dtype:
// fp32, or fp64), all contiguous on one device.
void adamw_(const Tensor& p, const Tensor& m, const Tensor& v, const Tensor& g, const kernels::AdamWScalars<float>& s);
void adamw_(const Tensor& p, const Tensor& m, const Tensor& v, const Tensor& g, const kernels::AdamWScalars<double>& s);
// Every grad (contiguous fp32) times inv_scale, in place; true when any held an inf or nan.
bool unscale_(const std::vector<Tensor>& grads, double inv_scale);
// The sum of every element's square, over all tensors (undefined ones skipped),
// in double; GPU tensors summed on their device and read once.
double sum_of_squares(const std::vector<Tensor>& tensors);

// Threads for the math: GEMMs, elementwise and per-row loops (OpenMP; see
// tensor/cpu/gemm.h). n <= 0 leaves the setting as it is.
void set_num_threads(int n);
int get_num_threads();

// The library fp32 GEMMs run on: "onednn" (the default when loom was built
// with oneDNN; LOOM_GEMM=openblas in the environment changes the default) or
// "openblas". fp64 GEMMs always run OpenBLAS. For comparisons (bench/gemm).
void set_gemm_library(const std::string& name);
std::string gemm_library();

// How bf16 products run on the CPU: "bf16" (bf16 operands, fp32 accumulation,
// oneDNN's matmul primitive; tensor/cpu/gemm_bf16.h) is the default where the
// CPU has AVX512_BF16 or AMX and loom was built with oneDNN; "fp32" (operands
// converted to fp32, the fp32 GEMM, the result rounded back) everywhere else,
// or with LOOM_GEMM_BF16=fp32 in the environment. "bf16" throws where the
// hardware lacks it. For comparisons (bench/gemm, bench/gpt_step).
void set_bf16_gemm(const std::string& mode);
std::string bf16_gemm();

}  // namespace loom::ops
