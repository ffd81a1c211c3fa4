// Causal attention's fast softmax rows (tensor/cpu/causal_softmax_rows.h)
// give the bits of the library's reference, ops::causal_softmax (per row
// kernels::causal_softmax_row), on every row of [T, n] scores: n from 1 to
// past four blocks of 16 (odd ones, rows shorter than a vector, rows ending
// in a partial block), a block of rows given at once or in pieces (the
// attention op's blocks start at a later row: visible0 > 1), in place and
// not, rows apart by more than n (nothing between rows written), scales of
// both signs, scores large enough for exp to underflow, and -inf scores.
// fp64 runs the reference row by row. The backward on the same cases: within
// its reference's rounding (the bound below), zeros past the visible values.
// tests/avx2.sh runs it at x86-64-v3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "tensor/cpu/causal_softmax_rows.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

using namespace loom;

namespace {

// The reference's bits are the FMAs the compiler makes of its a * b + c: GCC from -O2 on, clang at every
// level. Where the library is GCC's at -O0 or -O1 (the sanitizers' builds: tests/CMakeLists.txt defines
// LOOM_REFERENCE_UNCONTRACTED) they are rounded apart, and the fast rows are compared within a few units in
// the last place instead (seen: up to 3 ulp, GCC 12 -O1).
#ifdef LOOM_REFERENCE_UNCONTRACTED
constexpr int64_t kUlps = 4;
#else
constexpr int64_t kUlps = 0;
#endif

// Units in the last place between two finite values of one sign (+0 and -0, or equal bits: 0); any other pair: far.
template <class T>
int64_t ulps(T a, T b) {
  using I = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;
  if (a == b || std::memcmp(&a, &b, sizeof(T)) == 0) return 0;  // the same value, or the same bits (a NaN)
  if (!std::isfinite(a) || !std::isfinite(b) || std::signbit(a) != std::signbit(b)) return INT64_MAX;
  I ia, ib;
  std::memcpy(&ia, &a, sizeof(T));
  std::memcpy(&ib, &b, sizeof(T));
  return ia > ib ? int64_t(ia) - int64_t(ib) : int64_t(ib) - int64_t(ia);
}

template <class T>
DType dtype_of() {
  return std::is_same_v<T, double> ? kFloat64 : kFloat32;
}

struct Case {
  int64_t T, n;
  double spread, scale;
  int64_t piece;  // rows per call (the attention op's block)
};

// Scores [T, n] drawn at `spread`, a few -inf among them (never a row's first: a row needs one finite score);
// the reference on the whole matrix, the fast path on pieces of `piece` rows, stored `ld` = n + 3 apart.
template <class T>
void expect_reference_bits(const Case& c, uint64_t seed, bool in_place) {
  Generator g(seed);
  std::vector<T> x = ops::mul(randn({c.T, c.n}, g, dtype_of<T>()), c.spread).template to_vector<T>();
  for (size_t i = 7; i < x.size(); i += 29)
    if (i % size_t(c.n) != 0) x[i] = -INFINITY;
  const std::vector<T> ref = ops::causal_softmax(from_vector(x, {c.T, c.n}), c.scale).template to_vector<T>();
  const int64_t ld = c.n + 3;
  const T pad = T(12345);
  std::vector<T> in(size_t(c.T * ld), pad), out(size_t(c.T * ld), pad);
  for (int64_t t = 0; t < c.T; ++t) std::memcpy(&in[size_t(t * ld)], &x[size_t(t * c.n)], size_t(c.n) * sizeof(T));
  std::vector<T>& y = in_place ? in : out;
  for (int64_t r0 = 0; r0 < c.T; r0 += c.piece)
    cpu::causal_softmax_rows(&in[size_t(r0 * ld)], &y[size_t(r0 * ld)], ld, std::min(c.piece, c.T - r0), c.n, r0 + 1,
                             T(c.scale));
  int64_t differ = 0, pad_written = 0;
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t j = 0; j < c.n; ++j)
      differ += kUlps == 0 ? std::memcmp(&y[size_t(t * ld + j)], &ref[size_t(t * c.n + j)], sizeof(T)) != 0
                           : ulps(y[size_t(t * ld + j)], ref[size_t(t * c.n + j)]) > kUlps;
    for (int64_t j = c.n; j < ld; ++j) pad_written += y[size_t(t * ld + j)] != pad;
  }
  EXPECT_EQ(differ, 0) << "values that differ from ops::causal_softmax by more than " << kUlps << " ulp, of "
                        << c.T * c.n;
  EXPECT_EQ(pad_written, 0) << "values between rows written";
}

// dx = scale * y * (dy - dot) from both: the two dots differ by at most their sums' rounding, 2 (n / 16 + 6)
// eps sum |dy y| (one product's rounding, a lane's n / 16 adds, the tree's 4; both sides), and the three
// roundings after it add at most 4 eps (|dy| + |dot|); times |scale| y. Past the visible values, +0 exactly.
// Returns the worst |fast - reference| / bound (<= 1 passes).
template <class T>
double expect_backward_within_rounding(const Case& c, uint64_t seed, bool in_place) {
  Generator g(seed);
  const Tensor x = ops::mul(randn({c.T, c.n}, g, dtype_of<T>()), c.spread);
  const std::vector<T> y = ops::causal_softmax(x, c.scale).template to_vector<T>();
  const std::vector<T> dy = randn({c.T, c.n}, g, dtype_of<T>()).template to_vector<T>();
  const std::vector<T> ref =
      ops::causal_softmax_backward(from_vector(dy, {c.T, c.n}), from_vector(y, {c.T, c.n}), c.scale)
          .template to_vector<T>();
  const int64_t ld = c.n + 3;
  const T pad = T(12345);
  std::vector<T> g_in(size_t(c.T * ld), pad), y_in(size_t(c.T * ld), pad), out(size_t(c.T * ld), pad);
  for (int64_t t = 0; t < c.T; ++t) {
    std::memcpy(&g_in[size_t(t * ld)], &dy[size_t(t * c.n)], size_t(c.n) * sizeof(T));
    std::memcpy(&y_in[size_t(t * ld)], &y[size_t(t * c.n)], size_t(c.n) * sizeof(T));
  }
  std::vector<T>& dx = in_place ? g_in : out;
  for (int64_t r0 = 0; r0 < c.T; r0 += c.piece)
    cpu::causal_softmax_backward_rows(&g_in[size_t(r0 * ld)], ld, &y_in[size_t(r0 * ld)], ld, &dx[size_t(r0 * ld)], ld,
                                      std::min(c.piece, c.T - r0), c.n, r0 + 1, T(c.scale));
  const double eps = std::numeric_limits<T>::epsilon();
  double worst = 0;
  int64_t hidden_not_zero = 0, pad_written = 0;
  for (int64_t t = 0; t < c.T; ++t) {
    const int64_t visible = std::min(t + 1, c.n);
    double sum_abs = 0, dot = 0;
    for (int64_t j = 0; j < visible; ++j) {
      sum_abs += std::fabs(double(dy[size_t(t * c.n + j)]) * double(y[size_t(t * c.n + j)]));
      dot += double(dy[size_t(t * c.n + j)]) * double(y[size_t(t * c.n + j)]);
    }
    const T zero = T(0);
    for (int64_t j = 0; j < c.n; ++j) {
      const T got = dx[size_t(t * ld + j)];
      if (j >= visible) {
        hidden_not_zero += std::memcmp(&got, &zero, sizeof(T)) != 0;
        continue;
      }
      const double yj = y[size_t(t * c.n + j)], dyj = dy[size_t(t * c.n + j)];
      const double bound = std::fabs(c.scale) * yj * eps *
                               (2.0 * double(c.n / 16 + 6) * sum_abs + 4.0 * (std::fabs(dyj) + std::fabs(dot))) +
                           std::numeric_limits<T>::denorm_min();
      worst = std::max(worst, std::fabs(double(got) - double(ref[size_t(t * c.n + j)])) / bound);
    }
    for (int64_t j = c.n; j < ld; ++j) pad_written += dx[size_t(t * ld + j)] != pad;
  }
  EXPECT_LE(worst, 1.0) << "worst difference from ops::causal_softmax_backward, in units of its bound";
  EXPECT_EQ(hidden_not_zero, 0) << "values past the visible ones that are not +0";
  EXPECT_EQ(pad_written, 0) << "values between rows written";
  return worst;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {64, 64, 1.0, 0.1767766952966369, 64},  // the small GPT's block (hd 32)
      {256, 256, 2.0, 0.125, 64},             // the medium one's (hd 64): four blocks
      {70, 70, 1.0, 0.5, 64},                 // a second, short block
      {130, 130, 1.0, 0.5, 130},              // more rows in one call than one phase takes (64)
      {5, 5, 1.0, 0.5, 5},                    // shorter than a vector
      {15, 15, 1.0, 0.5, 4},
      {16, 16, 1.0, 0.5, 16},
      {17, 17, 1.0, 0.5, 3},
      {40, 33, 1.0, 0.7, 64},  // more rows than keys: rows past n see all n
      {33, 48, 1.0, 0.7, 64},
      {50, 63, 3.0, 0.7, 7},
      {65, 65, 1.0, -0.3, 64},   // a negative scale
      {64, 64, 300.0, 1.0, 64},  // exp underflows to 0 on most values
      {1, 1, 1.0, 1.0, 1},
  };
  return all;
}

}  // namespace

TEST(CausalSoftmaxRows, Float32GivesTheReferenceBits) {
  for (const Case& c : cases())
    for (bool in_place : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "T=" << c.T << " n=" << c.n << " spread=" << c.spread << " scale=" << c.scale
                                        << " piece=" << c.piece << (in_place ? " in place" : ""));
      expect_reference_bits<float>(c, uint64_t(c.T * 131 + c.n), in_place);
    }
}

TEST(CausalSoftmaxRows, Float64GivesTheReferenceBits) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(::testing::Message() << "T=" << c.T << " n=" << c.n << " piece=" << c.piece);
    expect_reference_bits<double>(c, uint64_t(c.T * 17 + c.n), true);
  }
}

TEST(CausalSoftmaxRows, BackwardIsTheReferenceWithinItsRounding) {
  double worst = 0;
  for (const Case& c : cases())
    for (bool in_place : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "T=" << c.T << " n=" << c.n << " spread=" << c.spread << " scale=" << c.scale
                                        << " piece=" << c.piece << (in_place ? " in place" : ""));
      worst = std::max(worst, expect_backward_within_rounding<float>(c, uint64_t(c.T * 7 + c.n), in_place));
    }
  std::printf("fp32 backward: worst difference %.3g of its bound\n", worst);
  for (const Case& c : cases()) {  // fp64: the reference itself
    SCOPED_TRACE(::testing::Message() << "fp64 T=" << c.T << " n=" << c.n);
    EXPECT_EQ(expect_backward_within_rounding<double>(c, uint64_t(c.T * 5 + c.n), true), 0.0);
  }
}
