// Causal attention's fast softmax rows (tensor/cpu/causal_softmax_rows.h)
// give the bits of the library's reference, ops::causal_softmax (per row
// kernels::causal_softmax_row), on every row of [T, n] scores: n from 1 to
// past four blocks of 16 (odd ones, rows shorter than a vector, rows ending
// in a partial block), a block of rows given at once or in pieces (the
// attention op's blocks start at a later row: visible0 > 1), in place and
// not, rows apart by more than n (nothing between rows written), scales of
// both signs, scores large enough for exp to underflow, and -inf scores.
// fp64 runs the reference row by row. tests/avx2.sh runs it at x86-64-v3.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "tensor/cpu/causal_softmax_rows.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

using namespace loom;

namespace {

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
      differ += std::memcmp(&y[size_t(t * ld + j)], &ref[size_t(t * c.n + j)], sizeof(T)) != 0;
    for (int64_t j = c.n; j < ld; ++j) pad_written += y[size_t(t * ld + j)] != pad;
  }
  EXPECT_EQ(differ, 0) << "values that differ from ops::causal_softmax, of " << c.T * c.n;
  EXPECT_EQ(pad_written, 0) << "values between rows written";
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
      {65, 65, 1.0, -0.3, 64},  // a negative scale
      {64, 64, 300.0, 1.0, 64},  // exp underflows to 0 on most values
      {1, 1, 1.0, 1.0, 1},
  };
  return all;
}

}  // namespace

TEST(CausalSoftmaxRows, Float32GivesTheReferenceBits) {
  for (const Case& c : cases())
    for (bool in_place : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "T=" << c.T << " n=" << c.n << " spread=" << c.spread << " scale="
                                        << c.scale << " piece=" << c.piece << (in_place ? " in place" : ""));
      expect_reference_bits<float>(c, uint64_t(c.T * 131 + c.n), in_place);
    }
}

TEST(CausalSoftmaxRows, Float64GivesTheReferenceBits) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(::testing::Message() << "T=" << c.T << " n=" << c.n << " piece=" << c.piece);
    expect_reference_bits<double>(c, uint64_t(c.T * 17 + c.n), true);
  }
}
