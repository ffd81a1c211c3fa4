// The fast causal softmax rows (causal_softmax_rows.h says what and why).
// Compiled in the library, so that a test compares it with the library's
// reference (ops::causal_softmax) under the same compiler flags: the rows it
// hands to the reference, and the FMAs the compiler puts into exp_approx.
#include "tensor/cpu/causal_softmax_rows.h"

#include <algorithm>
#include <cmath>

#include "tensor/kernels/softmax.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LOOM_CAUSAL_SOFTMAX_SIMD 1
#endif

namespace loom::cpu {

#ifdef LOOM_CAUSAL_SOFTMAX_SIMD
namespace causal_softmax_detail {

// kernels::exp_approx (tensor/kernels/exp.h) on 8 lanes, statement by statement.
inline __m256 exp_approx8(__m256 x) {
  const __m256 magic = _mm256_set1_ps(12582912.0f);
  const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), magic);
  const __m256 n = _mm256_sub_ps(t, magic);
  const __m256i ni = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(magic));
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // x - n * ln2_hi
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));  // p * r * r + r + 1
  const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1), bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  const __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-103.972084f), _CMP_LT_OQ);
  const __m256 over = _mm256_cmp_ps(x, _mm256_set1_ps(88.75f), _CMP_GT_OQ);
  return _mm256_or_ps(_mm256_andnot_ps(_mm256_or_ps(under, over), y),
                      _mm256_and_ps(over, _mm256_castsi256_ps(_mm256_set1_epi32(0x7f800000))));
}

// row_sum.h's lane_tree over lanes 0-7 (lo) and 8-15 (hi).
inline float tree_max(__m256 lo, __m256 hi) {
  const __m256 v8 = _mm256_max_ps(hi, lo);
  const __m128 v4 = _mm_max_ps(_mm256_extractf128_ps(v8, 1), _mm256_castps256_ps128(v8));
  const __m128 v2 = _mm_max_ps(_mm_movehl_ps(v4, v4), v4);
  return _mm_cvtss_f32(_mm_max_ss(_mm_movehdup_ps(v2), v2));
}
inline float tree_sum(__m256 lo, __m256 hi) {
  const __m256 v8 = _mm256_add_ps(lo, hi);
  const __m128 v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps(v8, 1));
  const __m128 v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
  return _mm_cvtss_f32(_mm_add_ss(v2, _mm_movehdup_ps(v2)));
}

// All-ones in the lanes j0 + l (l = 0..7) below `visible`.
inline __m256 seen(int64_t visible, int64_t j0) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int64_t left = std::clamp<int64_t>(visible - j0, 0, 8);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(int32_t(left)), lane));
}

constexpr int64_t kPhaseRows = 64;  // rows taken phase by phase at a time

// The values a row with `visible` seen of n covers in whole blocks of 16 (0: they end inside a block, and the
// row runs the reference).
inline int64_t whole_blocks(int64_t visible, int64_t n) {
  const int64_t w = std::min((visible + 15) / 16 * 16, n);
  return w % 16 == 0 ? w : 0;
}

inline void rows_by_phase(const float* x, float* y, int64_t ld, int64_t rows, int64_t n, int64_t visible0,
                          float scale) {
  float m[kPhaseRows], inv[kPhaseRows];
  int64_t w[kPhaseRows];  // the row's values, whole blocks of 16; 0: the row ran the reference
  const __m256 sc = _mm256_set1_ps(scale), neg_inf = _mm256_set1_ps(-INFINITY);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t visible = visible0 + i;
    const float* xr = x + i * ld;
    float* yr = y + i * ld;
    w[i] = whole_blocks(visible, n);
    if (w[i] == 0) {
      kernels::causal_softmax_row(xr, yr, long(n), long(visible), scale);
      continue;
    }
    __m256 lo = neg_inf, hi = neg_inf;
    for (int64_t j = 0; j < w[i]; j += 16) {
      const __m256 a = _mm256_blendv_ps(neg_inf, _mm256_mul_ps(_mm256_loadu_ps(xr + j), sc), seen(visible, j));
      const __m256 b = _mm256_blendv_ps(neg_inf, _mm256_mul_ps(_mm256_loadu_ps(xr + j + 8), sc), seen(visible, j + 8));
      _mm256_storeu_ps(yr + j, a);
      _mm256_storeu_ps(yr + j + 8, b);
      lo = j == 0 ? a : _mm256_max_ps(a, lo);  // row_max's `x > lane ? x : lane`
      hi = j == 0 ? b : _mm256_max_ps(b, hi);
    }
    m[i] = tree_max(lo, hi);
  }
  for (int64_t i = 0; i < rows; ++i) {
    float* yr = y + i * ld;
    const __m256 mv = _mm256_set1_ps(m[i]);
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (int64_t j = 0; j < w[i]; j += 16) {
      const __m256 a = exp_approx8(_mm256_sub_ps(_mm256_loadu_ps(yr + j), mv));
      const __m256 b = exp_approx8(_mm256_sub_ps(_mm256_loadu_ps(yr + j + 8), mv));
      _mm256_storeu_ps(yr + j, a);
      _mm256_storeu_ps(yr + j + 8, b);
      lo = _mm256_add_ps(lo, a);
      hi = _mm256_add_ps(hi, b);
    }
    if (w[i] > 0) inv[i] = 1.0f / tree_sum(lo, hi);
  }
  for (int64_t i = 0; i < rows; ++i) {
    if (w[i] == 0) continue;
    float* yr = y + i * ld;
    const __m256 iv = _mm256_set1_ps(inv[i]);
    for (int64_t j = 0; j < w[i]; j += 8) _mm256_storeu_ps(yr + j, _mm256_mul_ps(_mm256_loadu_ps(yr + j), iv));
    std::fill(yr + w[i], yr + n, 0.0f);
  }
}

// dx = scale * y * (dy - sum(dy * y)) on the visible values, 0 past them: first every row's sum, then every
// row's dx (each row's dy is read again before its dx overwrites it, so dx may be dy).
inline void backward_rows_by_phase(const float* dy, int64_t ld_dy, const float* y, int64_t ld_y, float* dx,
                                   int64_t ld_dx, int64_t rows, int64_t n, int64_t visible0, float scale) {
  float dot[kPhaseRows];
  int64_t w[kPhaseRows];
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t visible = visible0 + i;
    w[i] = whole_blocks(visible, n);
    if (w[i] == 0) continue;
    const float *dyr = dy + i * ld_dy, *yr = y + i * ld_y;
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (int64_t j = 0; j < w[i]; j += 16) {  // lane k += dy * y, rounded once each (no FMA), hidden lanes += 0
      lo = _mm256_add_ps(
          lo, _mm256_and_ps(seen(visible, j), _mm256_mul_ps(_mm256_loadu_ps(dyr + j), _mm256_loadu_ps(yr + j))));
      hi = _mm256_add_ps(hi, _mm256_and_ps(seen(visible, j + 8),
                                           _mm256_mul_ps(_mm256_loadu_ps(dyr + j + 8), _mm256_loadu_ps(yr + j + 8))));
    }
    dot[i] = tree_sum(lo, hi);
  }
  const __m256 sc = _mm256_set1_ps(scale);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t visible = visible0 + i;
    const float *dyr = dy + i * ld_dy, *yr = y + i * ld_y;
    float* dxr = dx + i * ld_dx;
    if (w[i] == 0) {
      kernels::causal_softmax_backward_row(dyr, yr, dxr, long(n), long(visible), scale);
      continue;
    }
    const __m256 d = _mm256_set1_ps(dot[i]);
    for (int64_t j = 0; j < w[i]; j += 8) {
      const __m256 g =
          _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(yr + j), _mm256_sub_ps(_mm256_loadu_ps(dyr + j), d)), sc);
      _mm256_storeu_ps(dxr + j, _mm256_and_ps(seen(visible, j), g));
    }
    std::fill(dxr + w[i], dxr + n, 0.0f);
  }
}

}  // namespace causal_softmax_detail
#endif

void causal_softmax_rows(const float* x, float* y, int64_t ld, int64_t rows, int64_t n, int64_t visible0, float scale) {
#ifdef LOOM_CAUSAL_SOFTMAX_SIMD
  namespace d = causal_softmax_detail;
  for (int64_t i = 0; i < rows; i += d::kPhaseRows)
    d::rows_by_phase(x + i * ld, y + i * ld, ld, std::min(d::kPhaseRows, rows - i), n, visible0 + i, scale);
#else
  for (int64_t i = 0; i < rows; ++i)
    kernels::causal_softmax_row(x + i * ld, y + i * ld, long(n), long(visible0 + i), scale);
#endif
}

void causal_softmax_rows(const double* x, double* y, int64_t ld, int64_t rows, int64_t n, int64_t visible0,
                         double scale) {
  for (int64_t i = 0; i < rows; ++i)
    kernels::causal_softmax_row(x + i * ld, y + i * ld, long(n), long(visible0 + i), scale);
}

void causal_softmax_backward_rows(const float* dy, int64_t ld_dy, const float* y, int64_t ld_y, float* dx,
                                  int64_t ld_dx, int64_t rows, int64_t n, int64_t visible0, float scale) {
#ifdef LOOM_CAUSAL_SOFTMAX_SIMD
  namespace d = causal_softmax_detail;
  for (int64_t i = 0; i < rows; i += d::kPhaseRows)
    d::backward_rows_by_phase(dy + i * ld_dy, ld_dy, y + i * ld_y, ld_y, dx + i * ld_dx, ld_dx,
                              std::min(d::kPhaseRows, rows - i), n, visible0 + i, scale);
#else
  for (int64_t i = 0; i < rows; ++i)
    kernels::causal_softmax_backward_row(dy + i * ld_dy, y + i * ld_y, dx + i * ld_dx, long(n), long(visible0 + i),
                                         scale);
#endif
}

void causal_softmax_backward_rows(const double* dy, int64_t ld_dy, const double* y, int64_t ld_y, double* dx,
                                  int64_t ld_dx, int64_t rows, int64_t n, int64_t visible0, double scale) {
  for (int64_t i = 0; i < rows; ++i)
    kernels::causal_softmax_backward_row(dy + i * ld_dy, y + i * ld_y, dx + i * ld_dx, long(n), long(visible0 + i),
                                         scale);
}

}  // namespace loom::cpu
