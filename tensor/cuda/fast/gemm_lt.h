// GEMMs on bf16/fp16 through cuBLASLt (issue 44), chosen by
// LOOM_CUDA_KERNELS=fast for bf16/fp16 operands (gemm_lt_plan.h, use_lt) from
// gemm.cpp's entry points; fp32 and float64 stay on the reference.
//
// What it does that the reference (gemm.cpp) does not:
//   - reads bf16/fp16 A and B natively and writes bf16/fp16 D: half the bytes
//     of the reference's "widen to fp32, sgemm, round", and none of its three
//     conversion kernels per product (x, w and the output);
//   - linear's bias in the GEMM's epilogue (CUBLASLT_EPILOGUE_BIAS): no copy of
//     the bias into every output row first;
//   - the bias gradient in the weight-gradient GEMM (CUBLASLT_EPILOGUE_BGRADB):
//     no separate column-sum launch (nor its conversion);
//   - linear_gelu (the MLP's c_fc and its GELU) in one call
//     (CUBLASLT_EPILOGUE_GELU_AUX_BIAS): y = gelu(x wᵀ + b) written with the
//     pre-activation h beside it (the "aux" matrix GELU's backward reads), no
//     gelu kernel reading h back;
//   - descriptors, layouts and the heuristic's algorithm made once per shape,
//     dtype, epilogue and pointer alignment (a cache per process), and one
//     32 MiB workspace per device (cudaMalloc'd once, outside the caching
//     allocator's counters).
// The backward of linear_gelu is the two ops' (autograd::linear_gelu records
// both nodes): the gelu_backward kernel, then linear's with BGRADB.
// CUBLASLT_EPILOGUE_DGELU_BGRAD is not used: it applies dgelu to a GEMM's
// *output*, which here is the next linear's (c_proj's) dgrad - a fusion across
// two ops' backward nodes that the autograd graph does not have.
//
// Numerics: fp32 accumulation, D rounded once to bf16/fp16 from fp32 - the
// reference's numbers to within accumulation order (a few units of bf16's
// last place at worst). The bias is added in fp32 before that rounding, as the
// reference's beta = 1 does. The bias gradient is summed in fp32 (the
// reference sums in double) and rounded once to the bias dtype. The same
// process picks the same algorithm for the same key, so a rerun gives the
// same bits (cuBLAS's own reproducibility on one GPU model).
// linear_gelu: h (aux) is that same fp32 sum rounded once, linear's numbers.
// y is GELU (the tanh form, as tensor/kernels/gelu.h) of the *unrounded* sum,
// rounded once; the two ops apply GELU to h already rounded (loom keeps h in
// the model's dtype). So y moves by GELU's slope (|gelu'| <= 1.13) times h's
// rounding on top of its own: |dy| <= u |y| + 1.13 u |h|, u = 2^-8 (bf16),
// 2^-11 (fp16), plus whatever cuBLASLt's fp32 tanh differs from loom's
// exp-based sigmoid (undocumented; fp32 evaluation error is far below u).
//
// Where cuBLASLt's heuristic offers no algorithm (an odd alignment, an epilogue
// a shape does not support), the GEMM goes to cublas_gemm with the same native
// operands, the bias copied in first (beta = 1) and db summed by the
// reference's column sum: same results, more launches. linear_gelu then runs
// the two ops (linear, then the gelu kernel), as it does for a width aux
// cannot take (N % 8 != 0).
#pragma once

#include "tensor/cuda/fast/gemm_lt_plan.h"
#include "tensor/ops.h"

namespace loom::cuda::fast {

// One GEMM of bf16/fp16 operands, C of the same dtype, no epilogue: cuBLASLt,
// else cublas_gemm. matmul's (gemm.cpp) bf16/fp16 products.
void gemm(const Device& d, DType t, const Gemm& g);

// linear and its backward (same contract as gemm.cpp's), for use_lt(x.dtype()).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b);
// h = linear(x, w, b) and y = gelu(h) from one GELU_AUX(_BIAS) call; the two
// ops where aux cannot take the width (N % 8 != 0) or no algorithm fits.
ops::LinearGeluResult linear_gelu(const Tensor& x, const Tensor& w, const Tensor& b);
ops::LinearGrads linear_backward(const Tensor& grad, const Tensor& x, const Tensor& w, bool need_x, bool need_w,
                                 bool need_b);

// How many GEMMs cuBLASLt ran and how many fell back to cuBLAS (per process):
// the GPU test checks the shapes it expects on cuBLASLt really ran there.
struct LtCounts {
  int64_t lt = 0, fallback = 0;
};
LtCounts lt_counts();

}  // namespace loom::cuda::fast
