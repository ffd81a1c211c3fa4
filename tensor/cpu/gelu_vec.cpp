// GELU's fast runs (gelu_vec.h says what and why). Compiled in the library:
// the runs' ends and the reference they must match share its flags.
#include "tensor/cpu/gelu_vec.h"

#include "tensor/kernels/gelu.h"

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#include <immintrin.h>
#define LOOM_GELU_VEC 1
#endif

namespace loom::cpu {

#ifdef LOOM_GELU_VEC
namespace gelu_vec_detail {

constexpr int kVecs = 4;  // vectors in flight
constexpr int64_t kStep = 8 * kVecs;
static_assert(kStep == kGeluRunStep);
inline __m256 splat(float x) { return _mm256_set1_ps(x); }

// kernels::exp_approx (tensor/kernels/exp.h) on kVecs vectors in place, statement by statement.
inline void exp_approx(__m256* x) {
  const __m256 magic = splat(12582912.0f);
  __m256 t[kVecs], n[kVecs], r[kVecs], p[kVecs];
  for (int v = 0; v < kVecs; ++v) t[v] = _mm256_fmadd_ps(x[v], splat(1.44269504088896341f), magic);
  for (int v = 0; v < kVecs; ++v) n[v] = _mm256_sub_ps(t[v], magic);
  for (int v = 0; v < kVecs; ++v) r[v] = _mm256_fnmadd_ps(n[v], splat(0.693359375f), x[v]);  // x - n * ln2_hi
  for (int v = 0; v < kVecs; ++v) r[v] = _mm256_fnmadd_ps(n[v], splat(-2.12194440e-4f), r[v]);
  for (int v = 0; v < kVecs; ++v) p[v] = _mm256_fmadd_ps(splat(1.9875691500e-4f), r[v], splat(1.3981999507e-3f));
  for (int v = 0; v < kVecs; ++v) p[v] = _mm256_fmadd_ps(p[v], r[v], splat(8.3334519073e-3f));
  for (int v = 0; v < kVecs; ++v) p[v] = _mm256_fmadd_ps(p[v], r[v], splat(4.1665795894e-2f));
  for (int v = 0; v < kVecs; ++v) p[v] = _mm256_fmadd_ps(p[v], r[v], splat(1.6666665459e-1f));
  for (int v = 0; v < kVecs; ++v) p[v] = _mm256_fmadd_ps(p[v], r[v], splat(5.0000001201e-1f));
  for (int v = 0; v < kVecs; ++v)  // p * r * r + r + 1
    p[v] = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p[v], r[v]), r[v], r[v]), splat(1.0f));
  const __m256i bias = _mm256_set1_epi32(127);
  for (int v = 0; v < kVecs; ++v) {  // * 2^(n/2) * 2^(n - n/2)
    const __m256i ni = _mm256_sub_epi32(_mm256_castps_si256(t[v]), _mm256_castps_si256(magic));
    const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    p[v] = _mm256_mul_ps(_mm256_mul_ps(p[v], s1), s2);
  }
  for (int v = 0; v < kVecs; ++v) {  // 0 below the range, inf above, NaN stays
    const __m256 under = _mm256_cmp_ps(x[v], splat(-103.972084f), _CMP_LT_OQ);
    const __m256 over = _mm256_cmp_ps(x[v], splat(88.75f), _CMP_GT_OQ);
    x[v] = _mm256_or_ps(_mm256_andnot_ps(_mm256_or_ps(under, over), p[v]),
                        _mm256_and_ps(over, _mm256_castsi256_ps(_mm256_set1_epi32(0x7f800000))));
  }
}

const float kK = float(0.7978845608028654), kC = float(0.044715), kC3 = float(3 * 0.044715);  // gelu.h's

// y[0:kStep] = gelu(x[0:kStep]): u = k (x + c x^3); y = x / (1 + exp(-2u)).
inline void gelu_step(const float* xp, float* yp) {
  __m256 x[kVecs], a[kVecs];
  for (int v = 0; v < kVecs; ++v) x[v] = _mm256_loadu_ps(xp + 8 * v);
  for (int v = 0; v < kVecs; ++v) a[v] = _mm256_mul_ps(_mm256_mul_ps(splat(kC), x[v]), x[v]);
  for (int v = 0; v < kVecs; ++v) a[v] = _mm256_fmadd_ps(a[v], x[v], x[v]);  // x + c x x x
  for (int v = 0; v < kVecs; ++v) a[v] = _mm256_mul_ps(_mm256_mul_ps(splat(kK), a[v]), splat(-2.0f));
  exp_approx(a);
  for (int v = 0; v < kVecs; ++v) _mm256_storeu_ps(yp + 8 * v, _mm256_div_ps(x[v], _mm256_add_ps(splat(1.0f), a[v])));
}

// o = g * (s + 2 x s (1 - s) du), s = sigmoid(2u), du = k (1 + 3c x^2), on kStep values.
inline void gelu_backward_step(const float* gp, const float* xp, float* op) {
  __m256 x[kVecs], x2[kVecs], a[kVecs], du[kVecs];
  for (int v = 0; v < kVecs; ++v) x[v] = _mm256_loadu_ps(xp + 8 * v);
  for (int v = 0; v < kVecs; ++v) x2[v] = _mm256_mul_ps(x[v], x[v]);
  for (int v = 0; v < kVecs; ++v) a[v] = _mm256_fmadd_ps(_mm256_mul_ps(splat(kC), x2[v]), x[v], x[v]);
  for (int v = 0; v < kVecs; ++v) du[v] = _mm256_mul_ps(splat(kK), _mm256_fmadd_ps(splat(kC3), x2[v], splat(1.0f)));
  for (int v = 0; v < kVecs; ++v) a[v] = _mm256_mul_ps(_mm256_mul_ps(splat(kK), a[v]), splat(-2.0f));
  exp_approx(a);
  for (int v = 0; v < kVecs; ++v) {
    const __m256 s = _mm256_div_ps(splat(1.0f), _mm256_add_ps(splat(1.0f), a[v]));
    const __m256 w = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(splat(2.0f), x[v]), s), _mm256_sub_ps(splat(1.0f), s));
    _mm256_storeu_ps(op + 8 * v, _mm256_mul_ps(_mm256_loadu_ps(gp + 8 * v), _mm256_fmadd_ps(w, du[v], s)));
  }
}

}  // namespace gelu_vec_detail
#endif

void gelu_run(const float* x, float* y, int64_t n) {
  int64_t j = 0;
#ifdef LOOM_GELU_VEC
  for (; j + gelu_vec_detail::kStep <= n; j += gelu_vec_detail::kStep) gelu_vec_detail::gelu_step(x + j, y + j);
#endif
  for (; j < n; ++j) y[j] = kernels::gelu(x[j]);
}
void gelu_run(const double* x, double* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = kernels::gelu(x[j]);
}

void gelu_backward_run(const float* g, const float* x, float* out, int64_t n) {
  int64_t j = 0;
#ifdef LOOM_GELU_VEC
  for (; j + gelu_vec_detail::kStep <= n; j += gelu_vec_detail::kStep)
    gelu_vec_detail::gelu_backward_step(g + j, x + j, out + j);
#endif
  for (; j < n; ++j) out[j] = kernels::gelu_backward(g[j], x[j]);
}
void gelu_backward_run(const double* g, const double* x, double* out, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] = kernels::gelu_backward(g[j], x[j]);
}

}  // namespace loom::cpu
