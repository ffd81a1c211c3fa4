// Internal to tensor/: the small fp32 products of causal attention's blocks
// (tensor/ops_attention.cpp), single-threaded, without a library call.
//
//   C [M, N] = (beta ? C : 0) + A [M, K] @ B [K, N]
//   A(i, k) = a[i * si + k * sk]   (A as stored: si = lda, sk = 1; Aᵀ: si = 1, sk = lda)
//   B [K, N] row-major (ldb); C [M, N] row-major (ldc)
//
// Why not oneDNN's sgemm (gemm.h): the small GPT's attention products are
// 64 x 64 x 32 and 64 x 32 x 64, ~0.25 MFLOP each, 1,536 calls a step; there
// the library's per-call work (choosing a kernel, packing both operands) ran
// the attention ops at 44-59% of the FMA ceiling (bench/README.md). And it
// cannot use what attention knows: half of each diagonal block is exact
// zeros (P and dS past the diagonal) or not needed (the scores past it).
// `Skip` says which, and this kernel leaves those terms out by tiles of rows:
//   k_end    A(i, k) == 0 for k > i + d   (P, dS: keys past query i)
//   k_begin  A(i, k) == 0 for k < i + d   (Pᵀ, dSᵀ: queries before key i)
//   j_end    C(i, j) for j > i + d is not needed (scores past the diagonal:
//            may be left unwritten or written, the softmax never reads them)
//
// Numbers: every C element is one fused multiply-add chain over k in order
// from 0, then (beta) one add of the old C: exactly what the reference below
// computes, whichever tile or edge loop computes it. Leaving out terms whose
// A entry is an exact zero does not change the chain (fma(0, b, s) == s for
// finite b, up to the sign of a zero). So the fast path and the reference give
// the same bits (tests/test_small_gemm.cpp, at both instruction sets).
//
// Registers: a tile is kRows rows x 2 vectors of C (AVX-512: 6 x 32 floats,
// 12 zmm accumulators; AVX2: 6 x 16, 12 ymm), each k step loading 2 vectors of
// B and broadcasting kRows elements of A. Columns past the last whole pair of
// vectors take one vector, then a scalar loop (the same chain); without AVX2
// everything is the scalar loop.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#define LOOM_SMALL_GEMM_SIMD 1
#endif

namespace loom::cpu {

template <class T>
struct SmallA {
  const T* a;
  int64_t si, sk;
  T at(int64_t i, int64_t k) const { return a[i * si + k * sk]; }
};

// Which terms may be skipped (see the top); kNone: none.
struct Skip {
  static constexpr int64_t kNone = std::numeric_limits<int64_t>::min();
  int64_t k_end = kNone, k_begin = kNone, j_end = kNone;
  static Skip zeros_after(int64_t d) { return {d, kNone, kNone}; }     // k_end
  static Skip zeros_before(int64_t d) { return {kNone, d, kNone}; }    // k_begin
  static Skip unneeded_after(int64_t d) { return {kNone, kNone, d}; }  // j_end
  int64_t k_hi(int64_t i, int64_t K) const { return k_end == kNone ? K : std::clamp<int64_t>(i + k_end + 1, 0, K); }
  int64_t k_lo(int64_t i, int64_t K) const { return k_begin == kNone ? 0 : std::clamp<int64_t>(i + k_begin, 0, K); }
  int64_t j_hi(int64_t i, int64_t N) const { return j_end == kNone ? N : std::clamp<int64_t>(i + j_end + 1, 0, N); }
};

// The reference: every element, every k, in order (the meaning of the fast path below).
template <class T>
void small_gemm_reference(int64_t M, int64_t N, int64_t K, SmallA<T> A, const T* B, int64_t ldb, T* C, int64_t ldc,
                          bool beta_one) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      T s = 0;
      for (int64_t k = 0; k < K; ++k) s = std::fma(A.at(i, k), B[k * ldb + j], s);
      C[i * ldc + j] = beta_one ? C[i * ldc + j] + s : s;
    }
}

namespace small_gemm_detail {

// rows x columns [j0, j1) of C one element at a time, k in [k0, k1).
template <class T>
void scalar_block(int64_t i0, int64_t rows, int64_t j0, int64_t j1, int64_t k0, int64_t k1, SmallA<T> A, const T* B,
                  int64_t ldb, T* C, int64_t ldc, bool beta_one) {
  for (int64_t i = i0; i < i0 + rows; ++i)
    for (int64_t j = j0; j < j1; ++j) {
      T s = 0;
      for (int64_t k = k0; k < k1; ++k) s = std::fma(A.at(i, k), B[k * ldb + j], s);
      C[i * ldc + j] = beta_one ? C[i * ldc + j] + s : s;
    }
}

#ifdef LOOM_SMALL_GEMM_SIMD
#ifdef __AVX512F__
using Vec = __m512;
constexpr int64_t kLanes = 16;
inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec splat(float x) { return _mm512_set1_ps(x); }
inline Vec zero() { return _mm512_setzero_ps(); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
#else
using Vec = __m256;
constexpr int64_t kLanes = 8;
inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec splat(float x) { return _mm256_set1_ps(x); }
inline Vec zero() { return _mm256_setzero_ps(); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
#endif

// R rows x V vectors of C at (i0, j0), k in [k0, k1): R * V accumulators.
template <int R, int V>
inline void tile(int64_t i0, int64_t j0, int64_t k0, int64_t k1, SmallA<float> A, const float* B, int64_t ldb, float* C,
                 int64_t ldc, bool beta_one) {
  Vec acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = zero();
  const float* a = A.a + i0 * A.si;
  for (int64_t k = k0; k < k1; ++k) {
    const float* b = B + k * ldb + j0;
    Vec bv[V];
    for (int v = 0; v < V; ++v) bv[v] = load(b + v * kLanes);
    for (int r = 0; r < R; ++r) {
      const Vec av = splat(a[r * A.si + k * A.sk]);
      for (int v = 0; v < V; ++v) acc[r][v] = fma(av, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) {
      float* c = C + (i0 + r) * ldc + j0 + v * kLanes;
      store(c, beta_one ? add(load(c), acc[r][v]) : acc[r][v]);
    }
}

template <int V>
inline void tile_rows(int64_t rows, int64_t i0, int64_t j0, int64_t k0, int64_t k1, SmallA<float> A, const float* B,
                      int64_t ldb, float* C, int64_t ldc, bool beta_one) {
  switch (rows) {
    case 6: return tile<6, V>(i0, j0, k0, k1, A, B, ldb, C, ldc, beta_one);
    case 5: return tile<5, V>(i0, j0, k0, k1, A, B, ldb, C, ldc, beta_one);
    case 4: return tile<4, V>(i0, j0, k0, k1, A, B, ldb, C, ldc, beta_one);
    case 3: return tile<3, V>(i0, j0, k0, k1, A, B, ldb, C, ldc, beta_one);
    case 2: return tile<2, V>(i0, j0, k0, k1, A, B, ldb, C, ldc, beta_one);
    default: return tile<1, V>(i0, j0, k0, k1, A, B, ldb, C, ldc, beta_one);
  }
}
#endif

}  // namespace small_gemm_detail

constexpr int64_t kSmallGemmRows = 6;  // rows of C per tile

// The fast path: the reference's numbers, skipping what `skip` allows. fp32
// runs the vector tiles; fp64 (gradient checks) the scalar loop only.
template <class T>
void small_gemm(int64_t M, int64_t N, int64_t K, SmallA<T> A, const T* B, int64_t ldb, T* C, int64_t ldc,
                bool beta_one, Skip skip = {}) {
  namespace d = small_gemm_detail;
  for (int64_t i0 = 0; i0 < M; i0 += kSmallGemmRows) {
    const int64_t rows = std::min(kSmallGemmRows, M - i0), last = i0 + rows - 1;
    // The tile's k range is the union of its rows' (k_lo and k_hi grow with i).
    const int64_t k0 = skip.k_lo(i0, K), k1 = std::max(k0, skip.k_hi(last, K));
    int64_t jn = skip.j_hi(last, N), j = 0;
#ifdef LOOM_SMALL_GEMM_SIMD
    if constexpr (std::is_same_v<T, float>) {
      jn = std::min(N, (jn + d::kLanes - 1) / d::kLanes * d::kLanes);  // unneeded columns to a whole vector
      for (; j + 2 * d::kLanes <= jn; j += 2 * d::kLanes)
        d::tile_rows<2>(rows, i0, j, k0, k1, A, B, ldb, C, ldc, beta_one);
      for (; j + d::kLanes <= jn; j += d::kLanes) d::tile_rows<1>(rows, i0, j, k0, k1, A, B, ldb, C, ldc, beta_one);
    }
#endif
    d::scalar_block(i0, rows, j, jn, k0, k1, A, B, ldb, C, ldc, beta_one);
  }
}

// out [cols, rows] (row stride ldo) = in [rows, cols]ᵀ (row stride ldi): kᵀ and vᵀ for the products
// above. The reference, one element at a time.
template <class T>
void transpose_into_reference(const T* in, int64_t ldi, int64_t rows, int64_t cols, T* out, int64_t ldo) {
  for (int64_t c = 0; c < cols; ++c)  // contiguous writes: strided ones ran 3x slower (stores waiting on stores)
    for (int64_t r = 0; r < rows; ++r) out[c * ldo + r] = in[r * ldi + c];
}

#ifdef LOOM_SMALL_GEMM_SIMD
namespace small_gemm_detail {
// One 8 x 8 block of floats: 8 row loads, the textbook AVX shuffle network
// (unpack pairs, then quads, then swap 128-bit halves), 8 row stores, where
// the element loop above makes one strided load per float. The small GPT's kᵀ
// and vᵀ (256 heads of 64 x 32 a step) at AVX2: 0.23 -> 0.17 ms a step, timed
// outside loom (bench/README.md, issue 47).
inline void transpose_8x8(const float* in, int64_t ldi, float* out, int64_t ldo) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(in + i * ldi);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  // r[i], i < 4: column i of rows 0-3 in the low half, column i + 4 in the high; r[i + 4] the same of rows 4-7.
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(out + i * ldo, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(out + (i + 4) * ldo, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}
}  // namespace small_gemm_detail
#endif

// The fast path: fp32 in 8 x 8 blocks, the edges (rows or cols not a multiple of 8) and fp64 by the reference.
template <class T>
void transpose_into(const T* in, int64_t ldi, int64_t rows, int64_t cols, T* out, int64_t ldo) {
  int64_t r8 = 0, c8 = 0;
#ifdef LOOM_SMALL_GEMM_SIMD
  if constexpr (std::is_same_v<T, float>) {
    r8 = rows / 8 * 8, c8 = cols / 8 * 8;
    for (int64_t c = 0; c < c8; c += 8)
      for (int64_t r = 0; r < r8; r += 8) small_gemm_detail::transpose_8x8(in + r * ldi + c, ldi, out + c * ldo + r, ldo);
  }
#endif
  // What the blocks left: columns [c8, cols) of every row, then rows [r8, rows) of columns [0, c8).
  transpose_into_reference(in + c8, ldi, rows, cols - c8, out + c8 * ldo, ldo);
  transpose_into_reference(in + r8 * ldi, ldi, rows - r8, c8, out + r8, ldo);
}

}  // namespace loom::cpu
