// The host half of the cuBLASLt GEMM path (gemm_lt.h): which GEMMs take it,
// how loom's row-major GEMM becomes cuBLASLt's column-major one, which
// epilogue it carries, and the key its descriptors and chosen algorithm are
// cached under. Plain C++ (no CUDA headers) in every build, so that
// tests/test_gemm_lt_plan.cpp checks all of it on the CPU.
//
// Row-major -> column-major (gemm.cpp's rule): loom's C [M, N] = op(a) @ op(b)
// is cuBLASLt's D [N, M] = op(b) @ op(a) in column-major terms, so cuBLASLt's
// A is loom's b (transposed iff tb) and its B is loom's a (iff ta):
//   m = N, n = M, k = K;  A stored [trans_a ? k : m, trans_a ? m : k], ld ldb;
//   B stored [trans_b ? n : k, trans_b ? k : n], ld lda;  D [m, n], ld ldc.
// Epilogues (cublasLt.h): BIAS adds a vector of D's m rows to every column:
// loom's bias [N] on every output row. BGRADB sums op(B) over k into a vector
// of D's n columns: for dW [N, K] = gᵀ @ x (a = g, ta), loom's db [N] = the
// column sums of g [tokens, N], in the same call. GELU_AUX_BIAS adds the bias,
// writes that sum h to a second matrix ("aux", GELU's input, kept for the
// backward) and D = GELU(h) (the tanh form, as loom's): the MLP's c_fc and its
// activation in one call. aux has D's shape and its own leading dimension,
// which cuBLASLt wants a multiple of 8 (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD);
// loom gives it D's layout, a row-major [M, N] tensor, so N % 8 == 0.
// GELU_AUX is the same without a bias.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "tensor/cuda/gemm_desc.h"
#include "tensor/cuda/kernel_choice.h"

namespace loom::cuda::fast {

// bf16/fp16 under LOOM_CUDA_KERNELS=fast. fp32 stays on the reference (the
// CPU-equality tests need full fp32 products; TF32 stays opt-in), float64 too.
inline bool use_lt(DType t) { return fast_kernels() && (t == kBFloat16 || t == kFloat16); }

enum class LtEpilogue : uint8_t { None, Bias, BGradB, GeluAux, GeluAuxBias };

// The forward GEMM's epilogue: the bias in the GEMM, else none. The weight
// gradient's: BGRADB when the bias gradient is wanted.
inline LtEpilogue forward_epilogue(bool has_bias) { return has_bias ? LtEpilogue::Bias : LtEpilogue::None; }
inline LtEpilogue weight_grad_epilogue(bool need_b) { return need_b ? LtEpilogue::BGradB : LtEpilogue::None; }
// linear_gelu's forward: the bias (if any), then GELU, h written to aux.
inline LtEpilogue gelu_epilogue(bool has_bias) { return has_bias ? LtEpilogue::GeluAuxBias : LtEpilogue::GeluAux; }
inline bool is_gelu(LtEpilogue e) { return e == LtEpilogue::GeluAux || e == LtEpilogue::GeluAuxBias; }
// Whether linear_gelu's output width N suits the aux matrix's leading dimension (cuBLASLt: a multiple of 8).
inline bool gelu_aux_fits(int64_t N) { return N % 8 == 0; }

// One column-major operand as a cublasLtMatrixLayout describes it.
struct LtLayout {
  int64_t rows = 0, cols = 0, ld = 0, batch_stride = 0;
};

// Everything that picks cuBLASLt's descriptors and algorithm (no pointers):
// with the device index it is the cache key (gemm_lt.cpp).
struct LtPlan {
  int device = 0;
  DType dtype = kBFloat16;  // A, B, C/D and the bias vector
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0, batch = 1;
  LtLayout a, b, d;  // C is D (beta = 0 or 1 on the same matrix)
  LtEpilogue epilogue = LtEpilogue::None;
  int64_t bias_len = 0;  // Bias, GeluAuxBias: m; BGradB: n; else 0
  int64_t aux_ld = 0;    // GeluAux(Bias): aux [m, n]'s leading dimension (D's); else 0
  int align = 16;        // bytes every pointer (and batch offset) is a multiple of, at most 16
  bool beta_one = false;
  bool operator==(const LtPlan& o) const;
};

struct LtPlanHash {
  size_t operator()(const LtPlan& p) const;
};

// The largest power of two <= 16 that divides every address and byte offset given (0s ignored).
int common_alignment(std::initializer_list<uint64_t> bytes);

// linear's three GEMMs (gemm_lt.cpp), row-major as gemm.cpp states them; x,
// g contiguous [M, K], [M, N], w [N, K]:
//   forward  out [M, N] = x [M, K] @ wᵀ          (+ b: the BIAS epilogue; linear_gelu:
//                                                  GELU_AUX_BIAS, out = gelu(h), h to aux)
//   dx       dx [M, K]  = g [M, N] @ w [N, K]
//   dW       dW [N, K]  = gᵀ [N, M] @ x [M, K]   (+ db: the BGRADB epilogue)
Gemm linear_gemm(int64_t M, int64_t N, int64_t K, const void* x, const void* w, void* out);
Gemm linear_dx_gemm(int64_t M, int64_t N, int64_t K, const void* g, const void* w, void* dx);
Gemm linear_dw_gemm(int64_t M, int64_t N, int64_t K, const void* g, const void* x, void* dw);

// g (row-major, elements of t) as cuBLASLt's column-major call; bias: the bias
// (Bias, GeluAuxBias) or bias-gradient (BGradB) vector's address, else
// nullptr; aux: where GeluAux(Bias) writes h, laid out as g's C, else nullptr.
LtPlan lt_plan(const Device& dev, DType t, const Gemm& g, LtEpilogue e, const void* bias,
               const void* aux = nullptr);

}  // namespace loom::cuda::fast
