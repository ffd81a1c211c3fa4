// Internal to tensor/: bf16 GEMMs on CPUs that multiply bf16 natively (the
// fast path beside gemm.h, which stays the reference).
//
//   C [M, N] = beta * C + op(A) @ op(B),   A, B bf16, fp32 accumulation,
//                                          C fp32 or bf16 (rounded once, at the end)
//
// The trick: AVX512_BF16's vdpbf16ps multiplies 16 pairs of bf16 and adds
// both products of a pair into one fp32 lane, 32 multiply-adds per 512-bit
// instruction where fp32's vfmadd231ps does 16. At the same clock a bf16
// GEMM can run at twice the fp32 rate, and its operands are half the bytes.
// The reference path (ops_matmul.cpp, ops_linear.cpp with this one off)
// converts bf16 operands to fp32 (exact: bf16 is an fp32's top half) and runs
// sgemm: the same products and the same fp32 sums in another order, so the
// two agree to fp32 rounding before the result is rounded to bf16.
//
// A bf16 C saves the ops a pass: loom's bf16 matmul and linear round their
// fp32 result to bf16 anyway, and oneDNN does it in the kernel's last step.
//
// oneDNN 2.6 has no public bf16 GEMM function; its matmul primitive with bf16
// src and weights runs the brgemm kernels (impl "brg:avx512_core_bf16";
// ONEDNN_VERBOSE=1 prints it). A transposed operand is a memory descriptor
// with strides {1, ld}: read in place, not copied. Measured on one Zen 5 core
// (bench/gemm): 1024^3 in 5.5 ms against sgemm's 10.7; 64x64x32 in 1.1 us
// against 1.4 -- faster at every shape the GPT uses.
//
// A primitive is made for one shape: (M, N, K, transposes, leading dims,
// beta, C's dtype). Making one JIT-compiles a kernel (~0.3 ms); even when
// oneDNN's own primitive cache has it, asking again costs ~4 us, four times a
// 64x64x32 product. So gemm_bf16.cpp keeps its own map from that key to the
// primitive, and each thread keeps the primitive's argument list (the
// dnnl::memory objects), pointed at each call's matrices: making them anew
// cost another ~1 us a call.
//
// Threads, as in gemm.h: each call runs single-threaded (the primitive is
// made and run with this thread's OpenMP thread count at 1, so its blocking
// never depends on --threads), a large product is split by rows or columns
// of C over loom's math threads, and the same --threads gives the same bits.
#pragma once

#include <atomic>
#include <cstdint>

#include "tensor/dtype.h"

namespace loom::cpu {

// Whether this CPU multiplies bf16 natively (AVX512_BF16 or AMX, as oneDNN
// detects it) and loom was built with oneDNN.
bool bf16_gemm_hardware();

// The switch: on by default where the hardware has it; LOOM_GEMM_BF16=fp32 in
// the environment (or ops::set_bf16_gemm("fp32")) sends bf16 products down
// the reference path instead, for comparisons.
std::atomic<bool>& bf16_gemm_switch();
inline bool bf16_gemm_enabled() { return bf16_gemm_switch().load(std::memory_order_relaxed); }

// One single-threaded product; lda/ldb/ldc are row strides of the stored
// matrices (as gemm_serial). Falls back to converting this block to fp32 if
// oneDNN offers no native bf16 kernel for a layout.
void gemm_bf16_serial(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const bfloat16* A, int64_t lda,
                      const bfloat16* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm_bf16_serial(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const bfloat16* A, int64_t lda,
                      const bfloat16* B, int64_t ldb, float beta, bfloat16* C, int64_t ldc);

// The product split over the math threads by rows or columns of C (gemm.h's rule).
void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const bfloat16* A, int64_t lda,
               const bfloat16* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const bfloat16* A, int64_t lda,
               const bfloat16* B, int64_t ldb, float beta, bfloat16* C, int64_t ldc);

}  // namespace loom::cpu
