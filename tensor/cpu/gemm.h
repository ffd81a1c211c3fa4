// Internal to tensor/: the one GEMM entry point of the CPU ops (matmul, linear).
//
//   C [M, N] = beta * C + op(A) @ op(B),  row-major, op = transpose or not
//
// fp32 runs oneDNN's dnnl_sgemm (Debian's libdnnl-dev) when loom was built
// with it (LOOM_WITH_DNNL), else OpenBLAS's cblas_sgemm; fp64 (gradient
// checks) always runs OpenBLAS's cblas_dgemm. Why oneDNN: on an AVX-512 CPU
// it reaches 90-95% of the FMA ceiling where OpenBLAS 0.3.21 reaches ~50-90%
// depending on which kernels it picks (bench/gemm prints both side by side).
// LOOM_GEMM=openblas in the environment (or gemm_backend() below) switches
// fp32 back to OpenBLAS, for comparisons.
//
// This file is also the reference for bf16 and fp16: the ops widen those
// operands to fp32, call gemm() here and round the result back. Where the CPU
// multiplies bf16 natively (AVX512_BF16 or AMX) and loom has oneDNN, bf16
// products take the fast path in gemm_bf16.h instead (LOOM_GEMM_BF16=fp32
// sends them back here).
//
// Each call runs single-threaded; threads are ours: a large product is split
// by rows or columns of C over the math threads (cpu/parallel.h), a batch of
// small products (matmul) gives each thread whole products. Why not the
// library's own threads: they would be a second thread pool next to the one
// the elementwise loops use (OpenBLAS's idle workers spin for a long time
// after each call). oneDNN's Debian build threads with OpenMP, the same
// runtime as loom: inside loom's parallel region it sees omp_in_parallel()
// and runs on the calling thread; outside one, gemm_serial sets this thread's
// OpenMP thread count to 1 for the call, so it never starts a team of its own.
//
// Splitting C changes no number by more than rounding: each element of C is
// the same dot product whichever thread computes it. Whether it is the same
// bits is the library's choice: its kernels may sum in an order that depends
// on the block of C one call computes (OpenBLAS 0.3.21's Haswell kernels on
// an AMD EPYC: row blocks not a multiple of 24, any column split; oneDNN picks
// its K blocking from the shape), so a split GEMM agrees with the unsplit one
// to rounding only (tests/test_tensor_ops.cpp, Threads.*). Runs with the same
// --threads are bit-identical.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>

#ifdef LOOM_WITH_DNNL
#include <dnnl.h>
#endif

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
// oneDNN: no VTune hooks around its JIT kernels (by default each sgemm call
// also writes an ITT marker, ~1% of a small GPT step).
inline void blas_single_threaded() {
  static const bool once = [] {
    openblas_set_num_threads(1);
#ifdef LOOM_WITH_DNNL
    dnnl_set_jit_profiling_flags(0);
#endif
    return true;
  }();
  (void)once;
}

enum class GemmBackend { kOpenBLAS, kOneDNN };

// Which library runs fp32 products: oneDNN when built with it, unless the
// environment says LOOM_GEMM=openblas. Settable (bench/gemm compares both).
inline std::atomic<GemmBackend>& gemm_backend() {
  static std::atomic<GemmBackend> backend{[] {
#ifdef LOOM_WITH_DNNL
    const char* env = std::getenv("LOOM_GEMM");
    return env && std::strcmp(env, "openblas") == 0 ? GemmBackend::kOpenBLAS : GemmBackend::kOneDNN;
#else
    return GemmBackend::kOpenBLAS;
#endif
  }()};
  return backend;
}

// Aᵀ B at AVX2: which library. oneDNN 2.6's AVX2 sgemm reads A down its
// columns when it packs Aᵀ; with a row stride that is a power of two of at
// least 512 floats (2 KiB) those reads fall in the same few cache sets, and a
// weight gradient dW [512, 128] = gᵀ [512, 1024] @ x [1024, 128] ran at 65% of
// the FMA ceiling (89% with the stride padded to 520; Zen 4 held to AVX2,
// bench/README.md "AVX2 weight gradients"). OpenBLAS's Haswell kernel packs
// it at 80%; it also runs the other power-of-two case of the small GPT,
// dW [128, 512] = gᵀ @ x [1024, 512], at 85-90% against oneDNN's 74-77%.
// At K = 1024 other strides (384, 1536) stay on oneDNN, as fast or faster
// there; so do AVX-512 and products under 16 MFLOP (fp32 attention's
// blocks do not come here: tensor/cpu/small_gemm.h). A pure function of the
// call, so tests can ask it.
// The medium GPT's weight gradients (K = 2048 tokens; strides 384, 1152,
// 1536, each thread's half) went the same way at every stride: oneDNN's AVX2
// sgemm 58-92 GF/s, OpenBLAS 77-99 (qkv's a tie; bench/README.md "The medium
// config at 2 threads"), so a K of 2048 or more goes too, for products of
// at least 128 x 128 (the head's dW [65, 384] ran 100 GF/s on oneDNN, 76 there).
inline bool aliased_stride(int64_t ld) { return ld >= 512 && (ld & (ld - 1)) == 0; }
inline bool tn_goes_to_openblas(bool onednn_avx512, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda,
                                int64_t ldb) {
  return !onednn_avx512 && ta && !tb && 2 * M * N * K >= (int64_t(1) << 24) &&
         (aliased_stride(lda) || aliased_stride(ldb) || (K >= 2048 && std::min(M, N) >= 128));
}

#ifdef LOOM_WITH_DNNL
// Whether oneDNN runs AVX-512 kernels here: the CPU's ISA, capped by
// ONEDNN_MAX_CPU_ISA (which is how an AVX-512 machine runs an AVX2 laptop's kernels).
inline bool onednn_avx512() {
  static const bool yes = (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
  return yes;
}
#endif

// One single-threaded product. lda/ldb/ldc are row strides of the stored matrices.
inline void gemm_serial(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                        const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
#ifdef LOOM_WITH_DNNL
  if (gemm_backend().load(std::memory_order_relaxed) == GemmBackend::kOneDNN &&
      !tn_goes_to_openblas(onednn_avx512(), ta, tb, M, N, K, lda, ldb)) {
#ifdef _OPENMP
    // Outside a parallel region oneDNN would start omp_get_max_threads()
    // threads; this thread's setting goes to 1 for the call and back after.
    const bool outside = !omp_in_parallel();
    const int saved = outside ? omp_get_max_threads() : 1;
    if (outside && saved != 1) omp_set_num_threads(1);
#endif
    dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
#ifdef _OPENMP
    if (outside && saved != 1) omp_set_num_threads(saved);
#endif
    return;
  }
#endif
  cblas_sgemm(101, ta ? 112 : 111, tb ? 112 : 111, int(M), int(N), int(K), 1.0f, A, int(lda), B, int(ldb), beta, C,
              int(ldc));
}
inline void gemm_serial(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const double* A, int64_t lda,
                        const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(101, ta ? 112 : 111, tb ? 112 : 111, int(M), int(N), int(K), 1.0, A, int(lda), B, int(ldb), beta, C,
              int(ldc));
}

// How a product C [M, N] is split over the math threads (split_rows_or_columns
// below): by rows of C when A is the larger operand, else by columns, at
// least ~4 MFLOP per thread (below that the split costs more than it saves).
// part(m, n, a, b, c) computes one block: c [m, n] from a's first m rows (or
// columns, when ta) and b's first n columns (or rows, when tb). Any element
// types: the fp32 sgemm below and the bf16 kernel (gemm_bf16.cpp) share it.
template <class TA, class TC, class Part>
void split_rows_or_columns(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const TA* A, int64_t lda, const TA* B,
                           int64_t ldb, TC* C, int64_t ldc, const Part& part) {
  if (M >= N) {
    const int64_t grain = std::max<int64_t>(16, (int64_t(1) << 21) / std::max<int64_t>(N * K, 1));
    parallel_for(M, grain, [&](int64_t m0, int64_t m1) {
      part(m1 - m0, N, ta ? A + m0 : A + m0 * lda, B, C + m0 * ldc);
    });
  } else {
    const int64_t grain = std::max<int64_t>(16, (int64_t(1) << 21) / std::max<int64_t>(M * K, 1));
    parallel_for(N, grain, [&](int64_t n0, int64_t n1) {
      part(M, n1 - n0, A, tb ? B + n0 * ldb : B + n0, C + n0);
    });
  }
}

// The product split over the math threads, by rows or by columns of C. Each
// thread packs its part of one operand and all of the other, so the split
// goes along the dimension whose operand is larger: rows when A [M, K] is the
// larger (thread t: C[m0:m1, :] from A's rows m0..m1 and all of B), columns
// otherwise (a weight gradient gᵀ @ x with many tokens: B is the big one).
//
// Aᵀ Bᵀ on oneDNN, split over threads: B is first copied transposed and each
// thread runs Aᵀ B. oneDNN 2.6's sgemm is slow on a transposed-transposed
// block that is not square (one thread, Zen 5: 1024x1024x1024 182-185 GF/s,
// but 512x1024x1024, each half of the 2-thread row split, 131-136, where Aᵀ B
// on the same block runs at 186-189). Copying 1024 x 1024 transposed takes
// ~1 ms (one thread), ~10% of the product; on one thread it does not pay.
template <class T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
          T beta, T* C, int64_t ldc) {
  blas_single_threaded();
  if constexpr (std::is_same_v<T, float>) {
    if (ta && tb && max_threads() > 1 && M * N * K >= (int64_t(1) << 21) &&
        gemm_backend().load(std::memory_order_relaxed) == GemmBackend::kOneDNN) {
      std::unique_ptr<float[]> bt(new float[size_t(K * N)]);  // bt [K, N] = (B [N, K])ᵀ
      // Tiles of 32 columns of bt x 8 of its rows: writes of two whole cache
      // lines per row; reading 32 rows of B at a time (square tiles with a
      // power-of-two stride land in one cache set: 3x slower).
      parallel_for(K, 16, [&](int64_t k0, int64_t k1) {
        for (int64_t n0 = 0; n0 < N; n0 += 32)
          for (int64_t kb = k0; kb < k1; kb += 8) {
            float* out = bt.get();
            if (n0 + 32 <= N && kb + 8 <= k1) {  // a whole tile: fixed trip counts, so it vectorises
              for (int64_t k = kb; k < kb + 8; ++k)
                for (int64_t n = n0; n < n0 + 32; ++n) out[k * N + n] = B[n * ldb + k];
            } else {
              for (int64_t k = kb; k < std::min(kb + 8, k1); ++k)
                for (int64_t n = n0; n < std::min(n0 + 32, N); ++n) out[k * N + n] = B[n * ldb + k];
            }
          }
      });
      gemm(true, false, M, N, K, A, lda, bt.get(), N, beta, C, ldc);
      return;
    }
  }
  split_rows_or_columns(ta, tb, M, N, K, A, lda, B, ldb, C, ldc,
                        [&](int64_t m, int64_t n, const T* a, const T* b, T* c) {
                          gemm_serial(ta, tb, m, n, K, a, lda, b, ldb, beta, c, ldc);
                        });
}

}  // namespace loom::cpu
