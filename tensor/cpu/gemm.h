// Internal to tensor/: the one GEMM entry point of the CPU ops (matmul, linear).
//
//   C [M, N] = beta * C + op(A) @ op(B),  row-major, op = transpose or not
//
// Each call runs OpenBLAS's single-threaded sgemm/dgemm; threads are ours: a
// large product is split by rows or columns of C over the math threads
// (cpu/parallel.h), a batch of small products (matmul) gives each thread
// whole products. Why
// not OpenBLAS's own threads: they would be a second thread pool next to the
// one the elementwise loops use, and an idle OpenBLAS worker spins (yielding)
// for a long time after each call, taking the core the other pool needs.
//
// Splitting C changes no number by more than rounding: each element of C is
// the same dot product whichever thread computes it. Whether it is the same
// bits is OpenBLAS's choice: on some CPUs its kernels sum in an order that
// depends on the block of C one call computes (an AMD EPYC with OpenBLAS
// 0.3.21's Haswell kernels: row blocks not a multiple of 24, any column
// split), so a split GEMM agrees with the unsplit one to rounding only
// (tests/test_tensor_ops.cpp, Threads.*). Runs with the same --threads are
// bit-identical.
#pragma once

#include <algorithm>
#include <cstdint>

#include "tensor/cpu/parallel.h"

extern "C" {
void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                 const float* b, int ldb, float beta, float* c, int ldc);
void cblas_dgemm(int order, int trans_a, int trans_b, int m, int n, int k, double alpha, const double* a, int lda,
                 const double* b, int ldb, double beta, double* c, int ldc);
void openblas_set_num_threads(int);
}

namespace loom::cpu {

// OpenBLAS runs single-threaded, always (set once, before the first GEMM).
inline void blas_single_threaded() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}

// One single-threaded product. lda/ldb/ldc are row strides of the stored matrices.
inline void gemm_serial(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                        const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(101, ta ? 112 : 111, tb ? 112 : 111, int(M), int(N), int(K), 1.0f, A, int(lda), B, int(ldb), beta, C,
              int(ldc));
}
inline void gemm_serial(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const double* A, int64_t lda,
                        const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(101, ta ? 112 : 111, tb ? 112 : 111, int(M), int(N), int(K), 1.0, A, int(lda), B, int(ldb), beta, C,
              int(ldc));
}

// The product split over the math threads, by rows or by columns of C. Each
// thread packs its part of one operand and all of the other, so the split
// goes along the dimension whose operand is larger: rows when A [M, K] is the
// larger (thread t: C[m0:m1, :] from A's rows m0..m1 and all of B), columns
// otherwise (a weight gradient gᵀ @ x with many tokens: B is the big one).
template <class T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
          T beta, T* C, int64_t ldc) {
  blas_single_threaded();
  if (M >= N) {
    // About 4 MFLOP per thread at least: below that the split costs more than it saves.
    const int64_t grain = std::max<int64_t>(16, (int64_t(1) << 21) / std::max<int64_t>(N * K, 1));
    parallel_for(M, grain, [&](int64_t m0, int64_t m1) {
      gemm_serial(ta, tb, m1 - m0, N, K, ta ? A + m0 : A + m0 * lda, lda, B, ldb, beta, C + m0 * ldc, ldc);
    });
  } else {
    const int64_t grain = std::max<int64_t>(16, (int64_t(1) << 21) / std::max<int64_t>(M * K, 1));
    parallel_for(N, grain, [&](int64_t n0, int64_t n1) {
      gemm_serial(ta, tb, M, n1 - n0, K, A, lda, tb ? B + n0 * ldb : B + n0, ldb, beta, C + n0, ldc);
    });
  }
}

}  // namespace loom::cpu
