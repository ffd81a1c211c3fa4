// matmul and linear on the GPU through cuBLAS, mirroring ops_matmul.cpp and
// ops_linear.cpp line for line: same shapes, same fp32 (fp64) compute type,
// bf16/fp16 converted in and rounded out, the bias as the GEMM's starting
// value (beta = 1), the bias gradient a double column sum rounded once.
//
// cuBLAS is column-major; loom is row-major. A row-major [M, N] matrix is the
// column-major [N, M] matrix of its transpose, so C = op(A) @ op(B) is asked
// for as Cᵀ = op(B)ᵀ @ op(A)ᵀ: the operands swap places, the op flags do not.
//
// TF32: off unless cuda::set_allow_tf32(true) (--tf32). CUBLAS_COMPUTE_32F
// keeps full fp32 products, so a GPU run can match the CPU run to rounding.
//
// LOOM_CUDA_KERNELS=fast: bf16/fp16 GEMMs go to cuBLASLt instead (fast/gemm_lt.h:
// operands read natively, the bias and its gradient in the GEMM's epilogues).
#include <algorithm>
#include <climits>

#include "tensor/cuda/check.h"
#include "tensor/cuda/context.h"
#include "tensor/cuda/cuda.h"
#include "tensor/cuda/cuda_ops.h"
#include "tensor/cuda/fast/gemm_lt.h"

namespace loom::cuda {

// One cuBLAS call (gemm_desc.h). t: the dtype of A, B and C.
void cublas_gemm(const Device& d, DType t, const Gemm& g) {
  LOOM_CHECK(g.M < INT_MAX && g.N < INT_MAX && g.K < INT_MAX && g.lda < INT_MAX && g.ldb < INT_MAX &&
                 g.ldc < INT_MAX && g.batch < INT_MAX,
             "matmul: [", g.M, ", ", g.K, "] @ [", g.K, ", ", g.N, "] x ", g.batch,
             ": dimensions exceed cuBLAS's 32-bit sizes");
  cublasHandle_t h = cublas_handle(d);
  DeviceGuard guard(d);
  const cublasOperation_t op_a = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  count_launch();  // one cuBLAS call, whichever branch makes it (launch_count.h)
  if (t == kFloat64) {
    const double alpha = 1, beta = g.beta;
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, op_b, op_a, int(g.N), int(g.M), int(g.K), &alpha, g.b, CUDA_R_64F,
                                            int(g.ldb), g.stride_b, g.a, CUDA_R_64F, int(g.lda), g.stride_a, &beta,
                                            g.c, CUDA_R_64F, int(g.ldc), g.stride_c, int(g.batch), CUBLAS_COMPUTE_64F,
                                            CUBLAS_GEMM_DEFAULT));
  } else {  // fp32 products; bf16/fp16 operands (the cuBLASLt path's fallback, fast/gemm_lt.cpp) read natively
    const float alpha = 1, beta = float(g.beta);
    const cudaDataType_t ty = t == kBFloat16 ? CUDA_R_16BF : t == kFloat16 ? CUDA_R_16F : CUDA_R_32F;
    const cublasComputeType_t compute =
        allow_tf32() && t == kFloat32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, op_b, op_a, int(g.N), int(g.M), int(g.K), &alpha, g.b, ty,
                                            int(g.ldb), g.stride_b, g.a, ty, int(g.lda), g.stride_a, &beta,
                                            g.c, ty, int(g.ldc), g.stride_c, int(g.batch), compute,
                                            CUBLAS_GEMM_DEFAULT));
  }
}

namespace {

DType compute_of(DType t) { return t == kFloat64 ? kFloat64 : kFloat32; }

// A [rows, cols] matrix with element strides (rs, cs) that BLAS can read in
// place: row-major (cs == 1) or a transposed view of a row-major block (rs == 1).
bool matrix_ok(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  return (cs == 1 && (rs >= cols || rows == 1)) || (rs == 1 && (cs >= rows || cols == 1));
}

// (transposed?, leading dim) of such a matrix.
std::pair<bool, int64_t> blas_operand(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  if (cs == 1 || cols == 1) return {false, std::max<int64_t>({rs, cols, 1})};
  return {true, std::max<int64_t>({cs, rows, 1})};
}

// The element stride between consecutive matrices of t's first nd (batch)
// dims when they walk memory evenly (0 when broadcast), else -1.
int64_t batch_stride(const Tensor& t, int64_t nd) {
  int64_t stride = -1, span = 0;
  for (int64_t d = nd - 1; d >= 0; --d) {
    const int64_t size = t.shape()[size_t(d)], st = t.strides()[size_t(d)];
    if (size == 1) continue;
    if (stride < 0) stride = st;
    else if (st != span) return -1;
    span = st * size;
  }
  return stride < 0 ? 0 : stride;
}

Shape with_last(Shape s, int64_t last) {
  s.back() = last;
  return s;
}

}  // namespace

// a: [..., M, K], b: [..., K, N] (checked by ops::matmul) -> [batch..., M, N]
Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  const int64_t M = a_in.size(-2), K = a_in.size(-1), N = b_in.size(-1);
  const DType out_dtype = a_in.dtype();
  const bool lt = fast::use_lt(out_dtype);  // bf16/fp16 stay themselves on cuBLASLt
  const DType cd = lt ? out_dtype : compute_of(out_dtype);
  Tensor a = ops::to(a_in, cd), b = ops::to(b_in, cd);
  if (b.dim() == 2 && a.dim() > 2)  // [..., M, K] @ [K, N]: the batch dims folded into M, one GEMM
    return ops::reshape(ops::to(matmul(ops::reshape(a, {-1, K}), b), out_dtype), with_last(a.shape(), N));

  Shape batch_a(a.shape().begin(), a.shape().end() - 2), batch_b(b.shape().begin(), b.shape().end() - 2);
  Shape batch = ops::broadcast_shapes("matmul", batch_a, batch_b);
  Shape out_shape = batch, full_a = batch, full_b = batch;
  out_shape.insert(out_shape.end(), {M, N});
  full_a.insert(full_a.end(), {M, K});
  full_b.insert(full_b.end(), {K, N});
  Tensor out = empty(out_shape, cd, a.device());
  if (K == 0) {  // an empty sum
    ops::zero_(out);
    return ops::to(out, out_dtype);
  }
  if (out.numel() == 0) return ops::to(out, out_dtype);
  const int64_t nd = int64_t(batch.size());
  Tensor ae = ops::expand(a, full_a), be = ops::expand(b, full_b);
  if (!matrix_ok(M, K, ae.stride(-2), ae.stride(-1)) || batch_stride(ae, nd) < 0) ae = ops::contiguous(ae);
  if (!matrix_ok(K, N, be.stride(-2), be.stride(-1)) || batch_stride(be, nd) < 0) be = ops::contiguous(be);
  auto [ta, lda] = blas_operand(M, K, ae.stride(-2), ae.stride(-1));
  auto [tb, ldb] = blas_operand(K, N, be.stride(-2), be.stride(-1));
  Gemm g;
  g.ta = ta, g.tb = tb, g.M = M, g.N = N, g.K = K;
  g.a = ae.raw_data(), g.lda = lda, g.stride_a = batch_stride(ae, nd);
  g.b = be.raw_data(), g.ldb = ldb, g.stride_b = batch_stride(be, nd);
  g.c = out.raw_data(), g.ldc = N, g.stride_c = M * N;
  g.batch = numel_of(batch);
  if (lt) fast::gemm(a.device(), cd, g);
  else cublas_gemm(a.device(), cd, g);
  return ops::to(out, out_dtype);
}

// x: [..., K], w: [N, K], b: [N] or undefined (checked by ops::linear) -> [..., N]
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  if (fast::use_lt(x.dtype())) return fast::linear(x, w, b);
  const DType cd = compute_of(x.dtype());
  Tensor x2 = ops::reshape(ops::contiguous(ops::to(x, cd)), {-1, x.size(-1)}), wc = ops::contiguous(ops::to(w, cd));
  const int64_t M = x2.size(0), K = x2.size(1), N = w.size(0);
  Tensor out = empty({M, N}, cd, x.device());
  Gemm g;  // out [M, N] (+)= x [M, K] @ wᵀ
  if (b.defined()) {  // every row starts as the bias; the GEMM adds onto it
    ops::copy_(out, ops::to(b, cd));
    g.beta = 1;
  }
  if (K == 0) {
    if (!b.defined()) ops::zero_(out);
  } else if (M > 0 && N > 0) {
    g.tb = true, g.M = M, g.N = N, g.K = K;
    g.a = x2.raw_data(), g.lda = K, g.b = wc.raw_data(), g.ldb = K, g.c = out.raw_data(), g.ldc = N;
    cublas_gemm(x.device(), cd, g);
  }
  return ops::reshape(ops::to(out, x.dtype()), with_last(x.shape(), N));
}

// The reference: the two ops (linear above, then the gelu kernel); fast: one cuBLASLt call.
ops::LinearGeluResult linear_gelu(const Tensor& x, const Tensor& w, const Tensor& b) {
  if (fast::use_lt(x.dtype())) return fast::linear_gelu(x, w, b);
  Tensor h = linear(x, w, b);
  return {h, ops::gelu(h)};
}

ops::LinearGrads linear_backward(const Tensor& grad, const Tensor& x, const Tensor& w, bool need_x, bool need_w,
                                 bool need_b) {
  if (fast::use_lt(x.dtype())) return fast::linear_backward(grad, x, w, need_x, need_w, need_b);
  const DType cd = compute_of(x.dtype());
  Tensor g2 = ops::reshape(ops::contiguous(ops::to(grad, cd)), {-1, grad.size(-1)});
  const int64_t M = g2.size(0), N = g2.size(1), K = w.size(1);
  ops::LinearGrads r;
  if (need_x) {  // dx [M, K] = g [M, N] @ w [N, K]
    Tensor wc = ops::contiguous(ops::to(w, cd));
    r.dx = empty({M, K}, cd, x.device());
    if (N == 0) {
      ops::zero_(r.dx);
    } else if (M > 0 && K > 0) {
      Gemm g;
      g.M = M, g.N = K, g.K = N;
      g.a = g2.raw_data(), g.lda = N, g.b = wc.raw_data(), g.ldb = K, g.c = r.dx.raw_data(), g.ldc = K;
      cublas_gemm(x.device(), cd, g);
    }
    r.dx = ops::reshape(ops::to(r.dx, x.dtype()), x.shape());
  }
  if (need_w) {  // dW [N, K] = gᵀ [N, M] @ x [M, K]
    Tensor x2 = ops::reshape(ops::contiguous(ops::to(x, cd)), {-1, K});
    r.dw = empty({N, K}, cd, x.device());
    if (M == 0) {
      ops::zero_(r.dw);
    } else if (N > 0 && K > 0) {
      Gemm g;
      g.ta = true, g.M = N, g.N = K, g.K = M;
      g.a = g2.raw_data(), g.lda = N, g.b = x2.raw_data(), g.ldb = K, g.c = r.dw.raw_data(), g.ldc = K;
      cublas_gemm(x.device(), cd, g);
    }
    r.dw = ops::to(r.dw, w.dtype());
  }
  if (need_b)  // db [N] = column sums of g in double, rounded once
    r.db = ops::to(ops::reshape(sum_in_double(g2, {true, false}), {N}), x.dtype());
  return r;
}

}  // namespace loom::cuda
