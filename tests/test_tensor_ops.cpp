// TensorOpsTest: every op in tensor/ops.h, forward, against values worked out
// by hand or computed here in double from the closed form (the references at
// the top of this file), never against loom itself.
//   elementwise -> reductions -> matmul -> softmax -> layer_norm -> indexing ->
//   cross_entropy -> dropout -> backward kernels -> low precision -> errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "tensor/generator.h"
#include "tensor/ops.h"
#include "tensor/profile.h"
#include "tensor/tensor.h"

using namespace loom;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
using Vec = std::vector<double>;

// [0, 1, 2, ...] as float32 in the given shape.
Tensor counting(const Shape& shape, DType dtype = kFloat32) {
  return ops::view(arange(0, double(numel_of(shape)), 1, dtype), shape);
}
Tensor f64(std::initializer_list<double> v, Shape shape = {}) { return loom::tensor(v, std::move(shape), kFloat64); }
Tensor ids(std::vector<int64_t> v, Shape shape = {}) { return from_vector(v, std::move(shape)); }
// float32 matrix from double values (small integers here, so exact).
Tensor mat(const Vec& v, Shape shape) { return ops::to(from_vector(v, std::move(shape)), kFloat32); }

// Every value of t within tol * max(1, |expected|) of the expected one.
void expect_near(const Tensor& t, const Vec& expected, double tol) {
  Vec got = t.to_vector<double>();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], expected[i], tol * std::max(1.0, std::abs(expected[i]))) << "at flat index " << i;
}

// ---- references in double -------------------------------------------------------

double gelu_ref(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

Vec softmax_ref(const Vec& x) {
  double m = *std::max_element(x.begin(), x.end()), s = 0;
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) s += y[i] = std::exp(x[i] - m);
  for (double& v : y) v /= s;
  return y;
}

double logsumexp_ref(const Vec& x) {
  double m = *std::max_element(x.begin(), x.end()), s = 0;
  for (double v : x) s += std::exp(v - m);
  return m + std::log(s);
}

// y = (x - mean) / sqrt(var + eps) * w + b over one row (biased variance).
Vec layer_norm_ref(const Vec& x, const Vec& w, const Vec& b, double eps = 1e-5) {
  double n = double(x.size()), mean = 0, var = 0;
  for (double v : x) mean += v / n;
  for (double v : x) var += (v - mean) * (v - mean) / n;
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = (x[i] - mean) / std::sqrt(var + eps) * w[i] + b[i];
  return y;
}

// out[b] = a[b] @ c[b] for row-major [M, K] and [K, N] blocks.
Vec matmul_ref(const Vec& a, const Vec& c, int64_t M, int64_t K, int64_t N) {
  Vec out(size_t(M * N), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k = 0; k < K; ++k) out[size_t(i * N + j)] += a[size_t(i * K + k)] * c[size_t(k * N + j)];
  return out;
}

// Small integers, so every product and sum is exact in fp32.
Vec pattern(int64_t n, int mod, int shift) {
  Vec v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = double((i * 7 + shift) % mod) - mod / 2;
  return v;
}
Vec slice(const Vec& v, int64_t start, int64_t n) { return Vec(v.begin() + start, v.begin() + start + n); }
Vec concat(const std::vector<Vec>& parts) {
  Vec out;
  for (const Vec& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// Central finite difference of a scalar function f at x, for the backward kernels.
Vec numeric_grad(const std::function<double(const Vec&)>& f, Vec x, double h = 1e-6) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double xi = x[i];
    x[i] = xi + h; double fp = f(x);
    x[i] = xi - h; double fm = f(x);
    x[i] = xi;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

}  // namespace

// ---- elementwise: binary with broadcasting ----------------------------------------

TEST(Elementwise, AddBroadcastsARowOverEveryRow) {  // [2, 3] + [3]
  Tensor a = loom::tensor({1, 2, 3, 4, 5, 6}, {2, 3}), b = loom::tensor({10, 20, 30});
  Tensor c = ops::add(a, b);
  EXPECT_EQ(c.shape(), (Shape{2, 3}));
  EXPECT_THAT(c.to_vector<float>(), ElementsAre(11, 22, 33, 14, 25, 36));
}

TEST(Elementwise, AddBroadcastsAColumnAgainstARow) {  // [2, 1] + [1, 3] -> [2, 3]
  Tensor c = ops::add(loom::tensor({1, 2}, {2, 1}), loom::tensor({10, 20, 30}, {1, 3}));
  EXPECT_EQ(c.shape(), (Shape{2, 3}));
  EXPECT_THAT(c.to_vector<float>(), ElementsAre(11, 21, 31, 12, 22, 32));
}

TEST(Elementwise, AddBroadcastsAZeroDimScalar) {
  Tensor c = ops::add(full({}, 0.5), loom::tensor({1, 2, 3, 4}, {2, 2}));
  EXPECT_EQ(c.shape(), (Shape{2, 2}));
  EXPECT_THAT(c.to_vector<float>(), ElementsAre(1.5, 2.5, 3.5, 4.5));
}

TEST(Elementwise, SubMulDivFollowTheirDefinitions) {
  Tensor a = loom::tensor({5, 7, 9}), b = loom::tensor({1, 2, -4});
  EXPECT_THAT(ops::sub(a, b).to_vector<float>(), ElementsAre(4, 5, 13));
  EXPECT_THAT(ops::mul(a, b).to_vector<float>(), ElementsAre(5, 14, -36));
  EXPECT_THAT(ops::div(a, b).to_vector<float>(), ElementsAre(5, 3.5, -2.25));
  EXPECT_EQ(ops::div(loom::tensor({1}), loom::tensor({0})).item<float>(), float(kInf));
}

TEST(Elementwise, MulBroadcastsAColumnOfScales) {
  Tensor c = ops::mul(loom::tensor({1, 2, 3, 4, 5, 6}, {2, 3}), loom::tensor({10, 100}, {2, 1}));
  EXPECT_THAT(c.to_vector<float>(), ElementsAre(10, 20, 30, 400, 500, 600));
}

TEST(Elementwise, NonContiguousOperandsAreReadInLogicalOrder) {
  Tensor t = ops::transpose(counting({2, 3}), 0, 1);  // [[0, 3], [1, 4], [2, 5]]
  EXPECT_THAT(ops::add(t, loom::tensor({100, 200})).to_vector<float>(), ElementsAre(100, 203, 101, 204, 102, 205));
}

TEST(Elementwise, ScalarVariants) {
  Tensor a = loom::tensor({1, 2, 4});
  EXPECT_THAT(ops::add(a, 1.5).to_vector<float>(), ElementsAre(2.5, 3.5, 5.5));
  EXPECT_THAT(ops::mul(a, -2).to_vector<float>(), ElementsAre(-2, -4, -8));
  EXPECT_THAT(ops::rsub(10, a).to_vector<float>(), ElementsAre(9, 8, 6));
  EXPECT_THAT(ops::rdiv(1, a).to_vector<float>(), ElementsAre(1, 0.5, 0.25));
}

// ---- elementwise: unary -----------------------------------------------------------

TEST(Elementwise, UnaryFunctionsMatchTheirClosedForms) {
  Vec x = {-2, -1, -0.5, 0, 0.5, 1, 2};
  Tensor t = loom::tensor({-2, -1, -0.5, 0, 0.5, 1, 2});
  Vec neg, ex, th, relu;
  for (double v : x) {
    neg.push_back(-v);
    ex.push_back(std::exp(v));
    th.push_back(std::tanh(v));
    relu.push_back(v > 0 ? v : 0);
  }
  expect_near(ops::neg(t), neg, 0);
  expect_near(ops::exp(t), ex, 1e-6);
  expect_near(ops::tanh(t), th, 1e-6);
  expect_near(ops::relu(t), relu, 0);
}

TEST(Elementwise, LogSqrtAndPowOnPositiveInputs) {
  Tensor t = loom::tensor({0.25, 1, 2, M_E, 4});
  expect_near(ops::log(t), {std::log(0.25), 0, std::log(2.0), 1, std::log(4.0)}, 1e-6);
  expect_near(ops::sqrt(t), {0.5, 1, std::sqrt(2.0), std::sqrt(M_E), 2}, 1e-6);
  expect_near(ops::pow(t, 2), {0.0625, 1, 4, M_E * M_E, 16}, 1e-6);
  expect_near(ops::pow(t, 0.5), {0.5, 1, std::sqrt(2.0), std::sqrt(M_E), 2}, 1e-6);
  expect_near(ops::pow(loom::tensor({-1.5, 2}), 3), {-3.375, 8}, 1e-6);
  EXPECT_TRUE(std::isnan(ops::log(loom::tensor({-1})).item<float>()));
}

TEST(Elementwise, GeluIsTheTanhApproximation) {
  Vec x = {-4, -3, -1, -0.5, 0, 0.5, 1, 3, 4};
  Vec expected;
  for (double v : x) expected.push_back(gelu_ref(v));
  expect_near(ops::gelu(loom::tensor({-4, -3, -1, -0.5, 0, 0.5, 1, 3, 4})), expected, 1e-6);
  expect_near(ops::gelu(f64({-4, -3, -1, -0.5, 0, 0.5, 1, 3, 4})), expected, 1e-14);
}

TEST(Elementwise, GtScalarIsOneWhereGreater) {
  EXPECT_THAT(ops::gt_scalar(loom::tensor({-1, 0, 0.5, 2}), 0).to_vector<float>(), ElementsAre(0, 0, 1, 1));
}

TEST(Elementwise, WherePicksAWhereConditionIsNonzeroAndBroadcasts) {
  Tensor cond = ids({1, 0, 1});                    // [3]
  Tensor a = loom::tensor({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor c = ops::where(cond, a, full({}, -1.0));  // [3], [2, 3], [] -> [2, 3]
  EXPECT_THAT(c.to_vector<float>(), ElementsAre(1, -1, 3, 4, -1, 6));
}

TEST(Elementwise, MaskedFillSetsMaskedPositions) {
  Tensor x = loom::tensor({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor m = loom::tensor({0, 1, 0, 1, 0, 0}, {2, 3});
  EXPECT_THAT(ops::masked_fill(x, m, -9).to_vector<float>(), ElementsAre(1, -9, 3, -9, 5, 6));
  Tensor row_mask = loom::tensor({1, 0, 0}, {1, 3});  // broadcast over rows
  EXPECT_THAT(ops::masked_fill(x, row_mask, 0).to_vector<float>(), ElementsAre(0, 2, 3, 0, 5, 6));
}

TEST(Elementwise, CausalMaskFillMasksColumnsAfterTheRow) {
  Tensor y = ops::causal_mask_fill(ones({2, 3, 3}), -kInf);
  Vec expected;
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) expected.push_back(j > i ? -kInf : 1.0);
  EXPECT_EQ(y.to_vector<double>(), expected);
  // T = 2 queries, S = 4 keys: row 0 keeps column 0, row 1 keeps columns 0..1.
  EXPECT_THAT(ops::causal_mask_fill(counting({2, 4}), -1).to_vector<float>(), ElementsAre(0, -1, -1, -1, 4, 5, -1, -1));
}

TEST(Elementwise, InPlaceAddAndMulWriteIntoTheDestination) {
  Tensor x = loom::tensor({1, 2, 3, 4}, {2, 2});
  ops::add_(x, loom::tensor({10, 20}), 0.5);  // broadcast row, scaled
  EXPECT_THAT(x.to_vector<float>(), ElementsAre(6, 12, 8, 14));
  ops::mul_(ops::narrow(x, 0, 1, 1), -1);
  EXPECT_THAT(x.to_vector<float>(), ElementsAre(6, 12, -8, -14));
}

// ---- reductions -------------------------------------------------------------------

TEST(Reductions, SumOverAllOrSomeDims) {
  Tensor x = loom::tensor({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor all = ops::sum(x);
  EXPECT_EQ(all.dim(), 0);
  EXPECT_EQ(all.item<float>(), 21.0f);
  EXPECT_THAT(ops::sum(x, {0}).to_vector<float>(), ElementsAre(5, 7, 9));
  EXPECT_THAT(ops::sum(x, {1}).to_vector<float>(), ElementsAre(6, 15));
  EXPECT_THAT(ops::sum(x, {-1}).to_vector<float>(), ElementsAre(6, 15));
  EXPECT_EQ(ops::sum(x, {1}, true).shape(), (Shape{2, 1}));
  EXPECT_EQ(ops::sum(x, {0, 1}).dim(), 0);
}

TEST(Reductions, SumOverOuterAndInnerDimsOfA3DTensor) {
  // x[i][j][k] = 12i + 4j + k; sum over i, k = 4*12*(0+1) + 8*4j + 2*(0+1+2+3) = 60 + 32j.
  Tensor s = ops::sum(counting({2, 3, 4}), {0, 2}, true);
  EXPECT_EQ(s.shape(), (Shape{1, 3, 1}));
  EXPECT_THAT(s.to_vector<float>(), ElementsAre(60, 92, 124));
}

TEST(Reductions, SumOfATransposedViewReducesLogicalDims) {
  Tensor t = ops::transpose(counting({2, 3}), 0, 1);  // [[0, 3], [1, 4], [2, 5]]
  EXPECT_THAT(ops::sum(t, {1}).to_vector<float>(), ElementsAre(3, 5, 7));
}

TEST(Reductions, MeanDividesByTheReducedCount) {
  Tensor x = loom::tensor({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(ops::mean(x).item<float>(), 3.5f);
  EXPECT_THAT(ops::mean(x, {0}).to_vector<float>(), ElementsAre(2.5, 3.5, 4.5));
  Tensor m = ops::mean(x, {1}, true);
  EXPECT_EQ(m.shape(), (Shape{2, 1}));
  EXPECT_THAT(m.to_vector<float>(), ElementsAre(2, 5));
}

TEST(Reductions, MaxReturnsValuesAndTheFirstIndexOfTheMax) {
  Tensor x = loom::tensor({1, 5, 3, 7, 2, 7}, {2, 3});
  auto [rows, rows_at] = ops::max(x, 1);
  EXPECT_THAT(rows.to_vector<float>(), ElementsAre(5, 7));
  EXPECT_EQ(rows_at.dtype(), kInt64);
  EXPECT_THAT(rows_at.to_vector<int64_t>(), ElementsAre(1, 0));  // 7 appears at 0 and 2: first wins
  auto [cols, cols_at] = ops::max(x, 0, true);
  EXPECT_EQ(cols.shape(), (Shape{1, 3}));
  EXPECT_THAT(cols.to_vector<float>(), ElementsAre(7, 5, 7));
  EXPECT_THAT(cols_at.to_vector<int64_t>(), ElementsAre(1, 0, 1));
  EXPECT_EQ(ops::max(x).item<float>(), 7.0f);
  EXPECT_EQ(ops::max(loom::tensor({-3, -1, -2})).item<float>(), -1.0f);
}

TEST(Reductions, SumToReducesABroadcastBackToItsShape) {
  Tensor g = loom::tensor({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_THAT(ops::sum_to(g, {1, 3}).to_vector<float>(), ElementsAre(5, 7, 9));
  EXPECT_EQ(ops::sum_to(g, {3}).shape(), (Shape{3}));
  EXPECT_THAT(ops::sum_to(g, {2, 1}).to_vector<float>(), ElementsAre(6, 15));
  EXPECT_TRUE(ops::sum_to(g, {2, 3}).is_same(g));
}

// ---- matmul -----------------------------------------------------------------------

TEST(Matmul, TwoByThreeTimesThreeByTwo) {
  Tensor a = loom::tensor({1, 2, 3, 4, 5, 6}, {2, 3}), b = loom::tensor({7, 8, 9, 10, 11, 12}, {3, 2});
  Tensor c = ops::matmul(a, b);
  EXPECT_EQ(c.shape(), (Shape{2, 2}));
  // [1*7 + 2*9 + 3*11, 1*8 + 2*10 + 3*12; 4*7 + 5*9 + 6*11, 4*8 + 5*10 + 6*12]
  EXPECT_THAT(c.to_vector<float>(), ElementsAre(58, 64, 139, 154));
}

TEST(Matmul, RectangularMatchesTheTripleLoop) {
  Vec a = pattern(5 * 7, 9, 1), b = pattern(7 * 3, 7, 2);
  Tensor c = ops::matmul(mat(a, {5, 7}), mat(b, {7, 3}));
  expect_near(c, matmul_ref(a, b, 5, 7, 3), 0);
}

TEST(Matmul, Batched3DMultipliesEachBatch) {
  Vec a = pattern(2 * 3 * 4, 9, 0), b = pattern(2 * 4 * 5, 7, 3);
  Tensor c = ops::matmul(mat(a, {2, 3, 4}), mat(b, {2, 4, 5}));
  EXPECT_EQ(c.shape(), (Shape{2, 3, 5}));
  expect_near(c, concat({matmul_ref(slice(a, 0, 12), slice(b, 0, 20), 3, 4, 5),
                         matmul_ref(slice(a, 12, 12), slice(b, 20, 20), 3, 4, 5)}), 0);
}

TEST(Matmul, Batched4DMultipliesEachBatch) {
  Vec a = pattern(2 * 3 * 2 * 4, 11, 0), b = pattern(2 * 3 * 4 * 3, 5, 1);
  Tensor c = ops::matmul(mat(a, {2, 3, 2, 4}), mat(b, {2, 3, 4, 3}));
  EXPECT_EQ(c.shape(), (Shape{2, 3, 2, 3}));
  std::vector<Vec> parts;
  for (int64_t i = 0; i < 6; ++i) parts.push_back(matmul_ref(slice(a, i * 8, 8), slice(b, i * 12, 12), 2, 4, 3));
  expect_near(c, concat(parts), 0);
}

TEST(Matmul, A2DRightOperandBroadcastsOverTheBatch) {  // [2, 3, 4] @ [4, 5]
  Vec a = pattern(24, 9, 0), b = pattern(20, 7, 1);
  Tensor c = ops::matmul(mat(a, {2, 3, 4}), mat(b, {4, 5}));
  EXPECT_EQ(c.shape(), (Shape{2, 3, 5}));
  expect_near(c, concat({matmul_ref(slice(a, 0, 12), b, 3, 4, 5), matmul_ref(slice(a, 12, 12), b, 3, 4, 5)}), 0);
}

TEST(Matmul, BatchDimsBroadcastAgainstEachOther) {  // [2, 1, 3, 4] @ [3, 4, 2] -> [2, 3, 3, 2]
  Vec a = pattern(24, 9, 0), b = pattern(24, 7, 2);
  Tensor c = ops::matmul(mat(a, {2, 1, 3, 4}), mat(b, {3, 4, 2}));
  EXPECT_EQ(c.shape(), (Shape{2, 3, 3, 2}));
  std::vector<Vec> parts;
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j) parts.push_back(matmul_ref(slice(a, i * 12, 12), slice(b, j * 8, 8), 3, 4, 2));
  expect_near(c, concat(parts), 0);
}

TEST(Matmul, TransposedAndNarrowedOperandsAreNotCopiedWrong) {
  // a_store is [K=4, M=3]; its transpose is the [3, 4] operand a[m][k] = a_store[k][m].
  Vec a_store = pattern(12, 9, 0), b_store = pattern(20, 7, 1);  // b_store [N=5, K=4]
  Vec a(12), b(20);
  for (int m = 0; m < 3; ++m) for (int k = 0; k < 4; ++k) a[size_t(m * 4 + k)] = a_store[size_t(k * 3 + m)];
  for (int k = 0; k < 4; ++k) for (int n = 0; n < 5; ++n) b[size_t(k * 5 + n)] = b_store[size_t(n * 4 + k)];
  Tensor at = ops::transpose(mat(a_store, {4, 3}), 0, 1);
  Tensor bt = ops::transpose(mat(b_store, {5, 4}), 0, 1);
  ASSERT_FALSE(at.is_contiguous());
  expect_near(ops::matmul(at, bt), matmul_ref(a, b, 3, 4, 5), 0);
  expect_near(ops::matmul(at, mat(b, {4, 5})), matmul_ref(a, b, 3, 4, 5), 0);
  // A narrowed operand has a row stride larger than its width: columns 1..4 of a [3, 6].
  Vec wide = pattern(18, 9, 4), left(12);
  for (int m = 0; m < 3; ++m) for (int k = 0; k < 4; ++k) left[size_t(m * 4 + k)] = wide[size_t(m * 6 + 1 + k)];
  expect_near(ops::matmul(ops::narrow(mat(wide, {3, 6}), 1, 1, 4), mat(b, {4, 5})),
              matmul_ref(left, b, 3, 4, 5), 0);
}

TEST(Matmul, TransposedBatchedOperand) {  // k^T in attention: [B, T, D] -> [B, D, T]
  Vec q = pattern(2 * 3 * 4, 9, 0), k = pattern(2 * 3 * 4, 7, 2);
  Tensor kt = ops::transpose(mat(k, {2, 3, 4}), 1, 2);
  Tensor s = ops::matmul(mat(q, {2, 3, 4}), kt);
  std::vector<Vec> parts;
  for (int64_t bi = 0; bi < 2; ++bi) {
    Vec kb(12);
    for (int t = 0; t < 3; ++t) for (int d = 0; d < 4; ++d) kb[size_t(d * 3 + t)] = k[size_t(bi * 12 + t * 4 + d)];
    parts.push_back(matmul_ref(slice(q, bi * 12, 12), kb, 3, 4, 3));
  }
  expect_near(s, concat(parts), 0);
}

TEST(Matmul, Float64KeepsDoublePrecision) {
  Tensor a = f64({1.0 / 3, 1.0 / 7, 0.1, 1e-9}, {2, 2}), b = f64({3, 1, 7, 1e9}, {2, 2});
  Tensor c = ops::matmul(a, b);
  EXPECT_EQ(c.dtype(), kFloat64);
  expect_near(c, {1.0 / 3 * 3 + 1.0 / 7 * 7, 1.0 / 3 + 1.0 / 7 * 1e9, 0.3 + 7e-9, 0.1 + 1.0}, 1e-15);
}

// ---- softmax ----------------------------------------------------------------------

TEST(Softmax, MatchesExpOverSumAndRowsSumToOne) {
  Tensor y = ops::softmax(loom::tensor({1, 2, 3, -1, 0, 1}, {2, 3}));
  expect_near(y, concat({softmax_ref({1, 2, 3}), softmax_ref({-1, 0, 1})}), 1e-6);
  expect_near(ops::sum(y, {1}), {1, 1}, 1e-6);
}

TEST(Softmax, IsStableForLargeInputs) {
  expect_near(ops::softmax(loom::tensor({1000, 1000})), {0.5, 0.5}, 1e-7);
  expect_near(ops::softmax(loom::tensor({1000, 0})), {1, 0}, 1e-7);  // e^-1000 underflows to 0
  expect_near(ops::softmax(loom::tensor({-1000, -1000, -1000, -1000})), {0.25, 0.25, 0.25, 0.25}, 1e-7);
}

TEST(Softmax, LogSoftmaxIsXMinusLogSumExp) {
  expect_near(ops::log_softmax(loom::tensor({1, 2, 3})),
              {1 - logsumexp_ref({1, 2, 3}), 2 - logsumexp_ref({1, 2, 3}), 3 - logsumexp_ref({1, 2, 3})}, 1e-6);
  expect_near(ops::log_softmax(loom::tensor({1000, 1000})), {-std::log(2.0), -std::log(2.0)}, 1e-6);
  expect_near(ops::log_softmax(loom::tensor({0, 1000})), {-1000, 0}, 1e-6);
}

TEST(Softmax, RunsOverTheLastDimOfANonContiguousTensor) {
  Tensor t = ops::transpose(loom::tensor({1, 2, 3, 4, 5, 6}, {2, 3}), 0, 1);  // rows [1, 4], [2, 5], [3, 6]
  Vec row = softmax_ref({1, 4});  // each row differs by 3
  expect_near(ops::softmax(t), concat({row, row, row}), 1e-6);
}

// ---- layer_norm -------------------------------------------------------------------

TEST(LayerNorm, RowsHaveMeanZeroAndVarianceOne) {
  Tensor x = loom::tensor({1, 2, 3, 4, 2, 4, 6, 8}, {2, 4});
  auto r = ops::layer_norm(x, Tensor(), Tensor());
  expect_near(r.y, concat({layer_norm_ref({1, 2, 3, 4}, {1, 1, 1, 1}, {0, 0, 0, 0}),
                           layer_norm_ref({2, 4, 6, 8}, {1, 1, 1, 1}, {0, 0, 0, 0})}), 1e-6);
  expect_near(ops::mean(r.y, {1}), {0, 0}, 1e-6);
  // biased variance of (x - mean) * rstd = var / (var + eps)
  expect_near(ops::mean(ops::pow(r.y, 2), {1}), {1.25 / (1.25 + 1e-5), 5 / (5 + 1e-5)}, 1e-6);
}

TEST(LayerNorm, ReturnsMeanAndRstdPerRow) {
  // row 0: mean 2.5, var ((1.5^2 + 0.5^2) * 2) / 4 = 1.25; row 1: mean 5, var (9 + 1 + 1 + 9) / 4 = 5.
  auto r = ops::layer_norm(loom::tensor({1, 2, 3, 4, 2, 4, 6, 8}, {2, 4}), Tensor(), Tensor());
  EXPECT_EQ(r.mean.shape(), (Shape{2}));
  expect_near(r.mean, {2.5, 5}, 1e-7);
  expect_near(r.rstd, {1 / std::sqrt(1.25 + 1e-5), 1 / std::sqrt(5 + 1e-5)}, 1e-6);
}

TEST(LayerNorm, AppliesWeightAndBias) {
  Tensor x = loom::tensor({1, 2, 3, 4, 2, 4, 6, 8, 0, 0, 1, 0}, {3, 4});
  Vec w = {1, 2, -1, 0.5}, b = {0, 1, 2, 3};
  auto r = ops::layer_norm(x, loom::tensor({1, 2, -1, 0.5}), loom::tensor({0, 1, 2, 3}));
  expect_near(r.y, concat({layer_norm_ref({1, 2, 3, 4}, w, b), layer_norm_ref({2, 4, 6, 8}, w, b),
                           layer_norm_ref({0, 0, 1, 0}, w, b)}), 1e-5);
}

TEST(LayerNorm, NormalizesTheLastDimOfA3DInputInFloat64) {
  Tensor x = f64({1, 2, 3, 4, 2, 4, 6, 8, 0, 0, 1, 0, -1, 1, -1, 1}, {2, 2, 4});
  auto r = ops::layer_norm(x, Tensor(), Tensor(), 0.0);
  EXPECT_EQ(r.y.shape(), (Shape{2, 2, 4}));
  EXPECT_EQ(r.mean.shape(), (Shape{4}));
  Vec ones4 = {1, 1, 1, 1}, zeros4 = {0, 0, 0, 0};
  expect_near(r.y, concat({layer_norm_ref({1, 2, 3, 4}, ones4, zeros4, 0),
                           layer_norm_ref({2, 4, 6, 8}, ones4, zeros4, 0),
                           layer_norm_ref({0, 0, 1, 0}, ones4, zeros4, 0), {-1, 1, -1, 1}}), 1e-14);
}

// ---- embedding and indexing -------------------------------------------------------

TEST(Embedding, LooksUpRowsIncludingRepeatedIndices) {
  Tensor w = counting({4, 3});  // row r = [3r, 3r + 1, 3r + 2]
  Tensor out = ops::embedding(w, ids({0, 3, 3, 1, 0, 2}, {2, 3}));
  EXPECT_EQ(out.shape(), (Shape{2, 3, 3}));
  EXPECT_THAT(out.to_vector<float>(),
              ElementsAre(0, 1, 2, 9, 10, 11, 9, 10, 11, 3, 4, 5, 0, 1, 2, 6, 7, 8));
  Tensor i32 = ops::to(ids({2}), kInt32);
  EXPECT_THAT(ops::embedding(w, i32).to_vector<float>(), ElementsAre(6, 7, 8));
}

TEST(Embedding, BackwardSumsTheGradientOfRepeatedIndices) {
  Tensor g = ops::embedding_backward(ones({2, 3, 2}), ids({0, 3, 3, 1, 0, 0}, {2, 3}), 5);
  EXPECT_EQ(g.shape(), (Shape{5, 2}));
  EXPECT_THAT(g.to_vector<float>(), ElementsAre(3, 3, 1, 1, 0, 0, 2, 2, 0, 0));
}

TEST(Indexing, IndexSelectPicksSlicesAlongADim) {
  Tensor x = counting({3, 4});
  EXPECT_THAT(ops::index_select(x, 0, ids({2, 0, 2})).to_vector<float>(),
              ElementsAre(8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11));
  Tensor cols = ops::index_select(x, 1, ids({3, 1}));
  EXPECT_EQ(cols.shape(), (Shape{3, 2}));
  EXPECT_THAT(cols.to_vector<float>(), ElementsAre(3, 1, 7, 5, 11, 9));
}

TEST(Indexing, IndexAddScattersSlicesIntoZeros) {
  Tensor out = ops::index_add(zeros({3, 2}), 0, ids({0, 2, 0}), loom::tensor({1, 2, 3, 4, 5, 6}, {3, 2}));
  EXPECT_THAT(out.to_vector<float>(), ElementsAre(6, 8, 0, 0, 3, 4));
}

TEST(Indexing, GatherReadsOneIndexPerOutputPosition) {
  Tensor x = loom::tensor({10, 11, 12, 13, 14, 15}, {2, 3});
  EXPECT_THAT(ops::gather(x, 1, ids({2, 0, 1, 1}, {2, 2})).to_vector<float>(), ElementsAre(12, 10, 14, 14));
  EXPECT_THAT(ops::gather(x, 0, ids({1, 0, 1}, {1, 3})).to_vector<float>(), ElementsAre(13, 11, 15));
}

TEST(Indexing, ScatterAddAccumulatesCollisions) {
  Tensor out = ops::scatter_add({2, 3}, 1, ids({0, 0, 2, 1, 1, 1}, {2, 3}), loom::tensor({1, 2, 3, 4, 5, 6}, {2, 3}));
  EXPECT_THAT(out.to_vector<float>(), ElementsAre(3, 0, 3, 0, 15, 0));
}

TEST(Joining, CatConcatenatesAlongADim) {
  Tensor a = loom::tensor({1, 2, 3, 4}, {2, 2}), b = loom::tensor({5, 6}, {2, 1});
  Tensor c = ops::cat({a, b}, 1);
  EXPECT_EQ(c.shape(), (Shape{2, 3}));
  EXPECT_THAT(c.to_vector<float>(), ElementsAre(1, 2, 5, 3, 4, 6));
  EXPECT_THAT(ops::cat({a, loom::tensor({7, 8}, {1, 2})}, 0).to_vector<float>(), ElementsAre(1, 2, 3, 4, 7, 8));
}

TEST(Joining, StackAddsANewDim) {
  Tensor a = loom::tensor({1, 2}), b = loom::tensor({3, 4});
  Tensor s0 = ops::stack({a, b}, 0), s1 = ops::stack({a, b}, -1);
  EXPECT_EQ(s0.shape(), (Shape{2, 2}));
  EXPECT_THAT(s0.to_vector<float>(), ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(s1.to_vector<float>(), ElementsAre(1, 3, 2, 4));
}

TEST(Joining, SplitThenCatRestoresTheTensor) {
  Tensor x = counting({3, 5});
  EXPECT_EQ(ops::cat(ops::split(x, 2, 1), 1).to_vector<float>(), x.to_vector<float>());
}

// cat_view: split's parts back as one view of their storage, equal to cat and sharing its memory; parts that
// are not neighbours (a gap, the wrong order, another storage, or elements that a longer view would visit twice)
// give an undefined tensor, so the caller copies (cat).
TEST(Joining, CatViewOfNeighboursIsTheirStorageAndElseUndefined) {
  Tensor x = counting({3, 2, 6});
  std::vector<Tensor> parts = ops::split(x, 2, 2);  // [3, 2, 2] each, rows 6 apart
  Tensor whole = ops::cat_view(parts, 2);
  ASSERT_TRUE(whole.defined());
  EXPECT_EQ(whole.shape(), x.shape());
  EXPECT_EQ(whole.to_vector<float>(), ops::cat(parts, 2).to_vector<float>());
  EXPECT_EQ(whole.storage(), x.storage());
  EXPECT_EQ(whole.data<float>(), x.data<float>());
  // Two of the three: the view of the first four columns.
  Tensor front = ops::cat_view({parts[0], parts[1]}, 2);
  ASSERT_TRUE(front.defined());
  EXPECT_EQ(front.to_vector<float>(), ops::narrow(x, 2, 0, 4).to_vector<float>());
  // A gap, the wrong order, another storage, another dim.
  EXPECT_FALSE(ops::cat_view({parts[0], parts[2]}, 2).defined());
  EXPECT_FALSE(ops::cat_view({parts[1], parts[0]}, 2).defined());
  EXPECT_FALSE(ops::cat_view({parts[0], ops::clone(parts[1])}, 2).defined());
  EXPECT_FALSE(ops::cat_view({parts[0], parts[1]}, 1).defined());
  // Rows of an expanded tensor share their elements: the [2, 3] view would hold each twice.
  Tensor row = ops::expand(ops::unsqueeze(counting({3}), 0), {2, 3});
  EXPECT_FALSE(ops::cat_view(ops::split(row, 1, 1), 1).defined());
  // Neighbours along a dim whose stride is smaller than another's extent would overlap: [2, 2] blocks of a
  // [4] vector read with strides (1, 1).
  Tensor v = counting({4});
  Tensor a = ops::unsqueeze(ops::narrow(v, 0, 0, 2), 1), b = ops::unsqueeze(ops::narrow(v, 0, 1, 2), 1);
  EXPECT_FALSE(ops::cat_view({a, b}, 1).defined());
}

// ---- cross_entropy ----------------------------------------------------------------

TEST(CrossEntropy, IsTheMeanOfMinusLogSoftmaxAtTheTarget) {
  Vec r0 = {1, 2, 3, 4}, r1 = {0, 0, 0, 0}, r2 = {-1, 5, 0.5, 2};
  Tensor logits = loom::tensor({1, 2, 3, 4, 0, 0, 0, 0, -1, 5, 0.5, 2}, {3, 4});
  auto ce = ops::cross_entropy(logits, ids({1, 3, 0}));
  double expected = (-std::log(softmax_ref(r0)[1]) - std::log(softmax_ref(r1)[3]) - std::log(softmax_ref(r2)[0])) / 3;
  EXPECT_EQ(ce.loss.dim(), 0);
  EXPECT_NEAR(ce.loss.item<double>(), expected, 1e-6);
  EXPECT_EQ(ce.count, 3);
  expect_near(ce.lse, {logsumexp_ref(r0), logsumexp_ref(r1), logsumexp_ref(r2)}, 1e-6);
}

TEST(CrossEntropy, IgnoredRowsAreLeftOutOfTheMean) {
  Tensor logits = f64({1, 2, 3, 4, 0, 0, 0, 0, -1, 5, 0.5, 2}, {3, 4});
  auto ce = ops::cross_entropy(logits, ops::to(ids({1, -100, 0}), kInt32));
  EXPECT_EQ(ce.count, 2);
  EXPECT_NEAR(ce.loss.item<double>(),
              (logsumexp_ref({1, 2, 3, 4}) - 2 + logsumexp_ref({-1, 5, 0.5, 2}) + 1) / 2, 1e-14);
  auto custom = ops::cross_entropy(logits, ids({1, 3, 3}), 3);  // ignore_index = 3
  EXPECT_EQ(custom.count, 1);
  EXPECT_NEAR(custom.loss.item<double>(), logsumexp_ref({1, 2, 3, 4}) - 2, 1e-14);
}

TEST(CrossEntropy, AllRowsIgnoredGivesNaN) {
  auto ce = ops::cross_entropy(zeros({2, 3}), ids({-100, -100}));
  EXPECT_EQ(ce.count, 0);
  EXPECT_TRUE(std::isnan(ce.loss.item<float>()));
}

TEST(CrossEntropy, IsStableAndAccurateForLargeLogits) {
  auto ce = ops::cross_entropy(loom::tensor({1000, 0, 0, 1000}, {2, 2}), ids({0, 0}));
  EXPECT_NEAR(ce.loss.item<double>(), (0.0 + 1000.0) / 2, 1e-6);  // row 0: log(1 + e^-1000); row 1: 1000
  // Equal logits of 1000: the loss is log 2 to fp32 precision, not 1000.69.. - 1000 rounded at 1000.
  auto tied = ops::cross_entropy(loom::tensor({1000, 1000}, {1, 2}), ids({0}));
  EXPECT_NEAR(tied.loss.item<double>(), std::log(2.0), 1e-7);
}

// ---- dropout ----------------------------------------------------------------------

TEST(Dropout, KeepsAboutOneMinusPAndScalesKeptValuesByOneOverOneMinusP) {
  PhiloxGenerator g{7};
  auto [y, mask] = ops::dropout(full({100000}, 2.0), 0.25, g);
  std::vector<float> yv = y.to_vector<float>(), mv = mask.to_vector<float>();
  int64_t kept = 0;
  for (size_t i = 0; i < yv.size(); ++i) {
    ASSERT_TRUE(mv[i] == 0.0f || mv[i] == float(1 / 0.75)) << mv[i];
    ASSERT_EQ(yv[i], 2.0f * mv[i]);
    kept += mv[i] != 0;
  }
  EXPECT_NEAR(double(kept) / 100000, 0.75, 0.01);
}

TEST(Dropout, IsDeterministicForASeed) {
  PhiloxGenerator g1{3}, g2{3}, g3{4};
  Tensor x = ones({1000});
  EXPECT_EQ(ops::dropout(x, 0.5, g1).second.to_vector<float>(), ops::dropout(x, 0.5, g2).second.to_vector<float>());
  PhiloxGenerator g4{3};
  EXPECT_NE(ops::dropout(x, 0.5, g4).second.to_vector<float>(), ops::dropout(x, 0.5, g3).second.to_vector<float>());
}

TEST(Dropout, ZeroProbabilityKeepsEverything) {
  PhiloxGenerator g{1};
  EXPECT_THAT(ops::dropout(loom::tensor({1, 2, 3}), 0.0, g).first.to_vector<float>(), ElementsAre(1, 2, 3));
}

// ---- backward kernels (checked against finite differences of the references) --------

TEST(Backward, GeluBackwardIsTheDerivativeTimesTheGradient) {
  Vec x = {-3, -1, -0.2, 0, 0.7, 2};
  Vec expected;
  const double h = 1e-6;  // the incoming gradient is 2
  for (double v : x) expected.push_back(2.0 * (gelu_ref(v + h) - gelu_ref(v - h)) / (2 * h));
  expect_near(ops::gelu_backward(full({6}, 2.0, kFloat64), f64({-3, -1, -0.2, 0, 0.7, 2})), expected, 1e-8);
}

TEST(Backward, SoftmaxAndLogSoftmaxBackwardAreVectorJacobianProducts) {
  Vec x = {0.5, -1, 2, 0.1}, dy = {1, -2, 0.5, 3};
  auto dot = [&](const Vec& y) {
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += dy[i] * y[i];
    return s;
  };
  auto dot_softmax = [&](const Vec& v) { return dot(softmax_ref(v)); };
  auto dot_log_softmax = [&](const Vec& v) {
    Vec y = v;
    for (double& e : y) e -= logsumexp_ref(v);
    return dot(y);
  };
  Tensor xt = f64({0.5, -1, 2, 0.1}), dyt = f64({1, -2, 0.5, 3});
  expect_near(ops::softmax_backward(dyt, ops::softmax(xt)), numeric_grad(dot_softmax, x), 1e-8);
  expect_near(ops::log_softmax_backward(dyt, ops::log_softmax(xt)), numeric_grad(dot_log_softmax, x), 1e-8);
}

TEST(Backward, LayerNormBackwardGivesInputWeightAndBiasGradients) {
  Vec x = {0.3, -1.2, 2.0, 0.5}, w = {1.5, -0.5, 2.0, 1.0}, b = {0.1, 0.2, 0.3, 0.4}, dy = {1, -2, 0.5, 3};
  auto loss = [&](const Vec& xx, const Vec& ww, const Vec& bb) {
    Vec y = layer_norm_ref(xx, ww, bb);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += dy[i] * y[i];
    return s;
  };
  Tensor xt = f64({0.3, -1.2, 2.0, 0.5}, {1, 4}), wt = f64({1.5, -0.5, 2.0, 1.0});
  auto fwd = ops::layer_norm(xt, wt, f64({0.1, 0.2, 0.3, 0.4}));
  auto g = ops::layer_norm_backward(f64({1, -2, 0.5, 3}, {1, 4}), xt, wt, fwd.mean, fwd.rstd);
  expect_near(g.dx, numeric_grad([&](const Vec& v) { return loss(v, w, b); }, x), 1e-7);
  expect_near(g.dweight, numeric_grad([&](const Vec& v) { return loss(x, v, b); }, w), 1e-7);
  expect_near(g.dbias, dy, 1e-12);
}

TEST(Backward, CrossEntropyBackwardIsSoftmaxMinusOneHotOverCount) {
  Vec x = {1, 2, 3, 0.5, -1, 0};  // [2, 3], targets {2, ignored}: count 1
  auto loss = [&](const Vec& v) { return logsumexp_ref(slice(v, 0, 3)) - v[2]; };
  Tensor xt = f64({1, 2, 3, 0.5, -1, 0}, {2, 3}), t = ids({2, -100});
  auto ce = ops::cross_entropy(xt, t);
  Tensor dx = ops::cross_entropy_backward(full({}, 3.0, kFloat64), xt, t, ce.lse, ce.count);
  Vec expected = numeric_grad(loss, x);
  for (double& v : expected) v *= 3.0;
  expect_near(dx, expected, 1e-7);
}

// ---- bf16 / fp16 inputs: compute in fp32, round the result to the input dtype ------

TEST(LowPrecision, ElementwiseResultsAreRoundedToTheInputDtype) {
  auto bf = [](std::initializer_list<double> v) { return loom::tensor(v, {}, kBFloat16); };
  // 1 + 2^-8 is a tie: rounds to even 1.0 (0x3F80); 1 + 2^-7 + 2^-8 ties up to 0x3F82.
  Tensor s = ops::add(bf({1, 1 + std::ldexp(1.0, -7)}), bf({std::ldexp(1.0, -8), std::ldexp(1.0, -8)}));
  EXPECT_EQ(s.dtype(), kBFloat16);
  EXPECT_EQ(s.data<bfloat16>()[0].bits, 0x3F80);
  EXPECT_EQ(s.data<bfloat16>()[1].bits, 0x3F82);
  // fp16: 65504 + 16 = 65520 is the overflow midpoint -> inf; 1 + 2^-11 ties to 1.
  Tensor h = ops::add(loom::tensor({65504, 1}, {}, kFloat16), loom::tensor({16, std::ldexp(1.0, -11)}, {}, kFloat16));
  EXPECT_EQ(h.dtype(), kFloat16);
  EXPECT_EQ(h.data<float16>()[0].bits, 0x7C00);
  EXPECT_EQ(h.data<float16>()[1].bits, 0x3C00);
}

TEST(LowPrecision, MatmulAccumulatesInFp32AndRoundsOnce) {
  // [1, 1] @ [1, 2^-8]^T = 1 + 2^-8 in fp32 -> bf16 tie -> 1.0.
  Tensor c = ops::matmul(loom::tensor({1, 1}, {1, 2}, kBFloat16),
                         loom::tensor({1, std::ldexp(1.0, -8)}, {2, 1}, kBFloat16));
  EXPECT_EQ(c.dtype(), kBFloat16);
  EXPECT_EQ(c.data<bfloat16>()[0].bits, 0x3F80);
  Tensor d = ops::matmul(loom::tensor({65504, 16}, {1, 2}, kFloat16), loom::tensor({1, 1}, {2, 1}, kFloat16));
  EXPECT_EQ(d.data<float16>()[0].bits, 0x7C00);  // 65520 in fp32 overflows fp16
}

TEST(LowPrecision, SoftmaxOfThreeEqualValuesIsOneThirdRounded) {
  // 1/3 in fp32 is 0x3EAAAAAB: bf16 rounds the low half 0xAAAB up -> 0x3EAB; fp16 nearest is 0x3555.
  Tensor b = ops::softmax(zeros({3}, kBFloat16));
  EXPECT_EQ(b.dtype(), kBFloat16);
  EXPECT_EQ(b.data<bfloat16>()[2].bits, 0x3EAB);
  EXPECT_EQ(ops::softmax(zeros({3}, kFloat16)).data<float16>()[0].bits, 0x3555);
}

TEST(LowPrecision, MeanRoundsTheFp32MeanNotTheRoundedSum) {
  // sum = 3.8984375 (not a bf16: 2^1 (1 + 121.5/128)); mean = 1.29947.. -> nearest bf16 1.296875 = 166/128.
  // Rounding the sum to bf16 first (3.90625) would give 1.3046875 instead.
  Tensor x = loom::tensor({1.265625, 1.125, 1.5078125}, {}, kBFloat16);
  Tensor m = ops::mean(x);
  EXPECT_EQ(m.dtype(), kBFloat16);
  EXPECT_EQ(m.item<double>(), 1.296875);
}

TEST(LowPrecision, NnOpsKeepTheInputDtypeAndStatisticsAreFp32) {
  Tensor x = loom::tensor({1, 2, 3, 4}, {1, 4}, kBFloat16);
  auto ln = ops::layer_norm(x, Tensor(), Tensor());
  EXPECT_EQ(ln.y.dtype(), kBFloat16);
  EXPECT_EQ(ln.mean.dtype(), kFloat32);
  double y3 = layer_norm_ref({1, 2, 3, 4}, {1, 1, 1, 1}, {0, 0, 0, 0})[3];  // 1.5 / sqrt(1.25 + eps)
  EXPECT_EQ(ln.y.data<bfloat16>()[3].bits, float_to_bf16(float(y3)).bits);
  EXPECT_EQ(ops::cross_entropy(x, ids({0})).loss.dtype(), kBFloat16);
  PhiloxGenerator g{1};
  Tensor mask = ops::dropout(ones({64}, kBFloat16), 0.25, g).second;
  for (int64_t i = 0; i < 64; ++i) {  // 4/3 = 0x3FAAAAAB in fp32 -> bf16 0x3FAB
    uint16_t bits = mask.data<bfloat16>()[i].bits;
    EXPECT_TRUE(bits == 0 || bits == 0x3FAB) << bits;
  }
}

// ---- threads ----------------------------------------------------------------------

TEST(Threads, SetNumThreadsToOneIsHonoured) {
  int before = ops::get_num_threads();
  ops::set_num_threads(1);
  EXPECT_EQ(ops::get_num_threads(), 1);
  ops::set_num_threads(before);
}

// The math threads split elementwise and per-row loops by chunks, never a
// sum: 1 and 2 threads must give the same bits. GEMMs are split by rows or
// columns of C, and there the bits are OpenBLAS's: on some CPUs its kernels
// sum an element of C in an order that depends on the block of C a call
// computes (on an AMD EPYC with OpenBLAS 0.3.21's Haswell kernels, row blocks
// that are not multiples of 24 and any column split change the last bit), so
// split GEMMs must agree to rounding, not to the bit. A wrong split (an offset
// or a leading dimension off) would be off by O(1).
TEST(Threads, LoopsAreBitIdenticalAndGemmsAgreeAtOneAndTwoThreads) {
  const int before = ops::get_num_threads();
  Generator g(7);
  Tensor x = randn({8, 128, 96}, g), w = randn({288, 96}, g), b = randn({288}, g), gy = randn({8, 128, 288}, g);
  Tensor lw = randn({96}, g), lb = randn({96}, g), att = randn({4, 3, 64, 64}, g), big = randn({256, 300}, g);
  struct Results {
    std::vector<Tensor> exact, gemm;
  };
  auto run = [&](int threads) {
    ops::set_num_threads(threads);
    auto ln = ops::layer_norm(x, lw, lb);
    auto lg = ops::layer_norm_backward(ln.y, x, lw, ln.mean, ln.rstd);
    auto d = ops::linear_backward(gy, x, w, true, true, true);
    Tensor y = ops::causal_softmax(att, 0.125);
    // A batch of small products: each thread computes whole products.
    return Results{{d.db, ln.y, lg.dx, lg.dweight, lg.dbias, ops::gelu(gy), ops::add(gy, b), y,
                    ops::causal_softmax_backward(att, y, 0.125), ops::matmul(att, att)},
                   {ops::linear(x, w, b), d.dx, d.dw, ops::matmul(ops::transpose(big, 0, 1), big)}};
  };
  Results one = run(1), two = run(2);
  ops::set_num_threads(before);
  for (size_t i = 0; i < one.exact.size(); ++i)
    EXPECT_EQ(one.exact[i].to_vector<float>(), two.exact[i].to_vector<float>()) << "result " << i;
  for (size_t i = 0; i < one.gemm.size(); ++i) {
    std::vector<float> a = one.gemm[i].to_vector<float>(), c = two.gemm[i].to_vector<float>();
    ASSERT_EQ(a.size(), c.size());
    // Rounding of a K-term dot product is relative to its terms, not to the
    // (possibly cancelled) result: compare against the tensor's scale.
    float scale = 0;
    for (float v : a) scale = std::max(scale, std::fabs(v));
    for (size_t j = 0; j < a.size(); ++j)
      ASSERT_NEAR(a[j], c[j], 1e-6f * scale) << "GEMM result " << i << ", element " << j;
  }
}

// fp32 GEMMs run on oneDNN (when built with it) or OpenBLAS
// (ops::set_gemm_library). Each library, on every transpose, a split over 2
// threads and a batch of products, must match the fp64 product (OpenBLAS's
// dgemm) to fp32 rounding of a K = 300 dot product; a wrong transpose or
// leading dimension would be off by O(1). The single 2-D products take the
// split path (cpu::gemm), where oneDNN's Aᵀ Bᵀ first copies B transposed.
TEST(GemmLibrary, EachLibraryMatchesTheFloat64Product) {
  const std::string before_lib = ops::gemm_library();
  const int before_threads = ops::get_num_threads();
  Generator g(11);
  Tensor a = randn({2, 130, 300}, g), b = randn({2, 300, 70}, g);
  Tensor at = ops::transpose(randn({2, 300, 130}, g), 1, 2), bt = ops::transpose(randn({2, 70, 300}, g), 1, 2);
  // One product of 130 x 300 x 70 (2.7 MFLOP): large enough for the split and the Bᵀ copy.
  Tensor a1 = randn({130, 300}, g), b1 = randn({300, 70}, g);
  Tensor at1 = ops::transpose(randn({300, 130}, g), 0, 1), bt1 = ops::transpose(randn({70, 300}, g), 0, 1);
  std::vector<std::string> libraries = {"openblas"};
  try {
    ops::set_gemm_library("onednn");
    libraries.push_back("onednn");
  } catch (const Error&) {
  }
  EXPECT_THROW(ops::set_gemm_library("mkl"), Error);
  for (const std::string& lib : libraries) {
    ops::set_gemm_library(lib);
    EXPECT_EQ(ops::gemm_library(), lib);
    for (int threads : {1, 2}) {
      ops::set_num_threads(threads);
      for (const auto& [x, y] : {std::pair{a, b}, {a, bt}, {at, b}, {at, bt}, {a1, b1}, {a1, bt1}, {at1, b1},
                                 {at1, bt1}}) {
        std::vector<float> got = ops::matmul(x, y).to_vector<float>();
        std::vector<double> want = ops::matmul(ops::to(x, kFloat64), ops::to(y, kFloat64)).to_vector<double>();
        ASSERT_EQ(got.size(), want.size());
        double scale = 0;
        for (double v : want) scale = std::max(scale, std::fabs(v));
        for (size_t j = 0; j < got.size(); ++j)
          ASSERT_NEAR(got[j], want[j], 1e-5 * scale) << lib << ", " << threads << " threads, element " << j;
      }
    }
  }
  ops::set_gemm_library(before_lib);
  ops::set_num_threads(before_threads);
}

// ---- errors -------------------------------------------------------------------------

TEST(Errors, MatmulInnerDimensionMismatchNamesBothShapes) {
  EXPECT_THAT([] { ops::matmul(zeros({4, 8}), zeros({7, 3})); },
              ThrowsMessage<Error>(::testing::StrEq("matmul: [4, 8] @ [7, 3]: inner dimensions 8 and 7 differ")));
  EXPECT_THAT([] { ops::matmul(zeros({4}), zeros({4, 3})); },
              ThrowsMessage<Error>(HasSubstr("matmul: [4] @ [4, 3]: both operands need at least 2 dims")));
  EXPECT_THAT([] { ops::matmul(zeros({2, 3, 4}), zeros({3, 4, 5})); },
              ThrowsMessage<Error>(HasSubstr("matmul: shapes [2] and [3] cannot broadcast")));
}

TEST(Errors, BroadcastFailureNamesBothShapes) {
  EXPECT_THAT([] { ops::add(zeros({2, 3}), zeros({4})); },
              ThrowsMessage<Error>(HasSubstr("add: shapes [2, 3] and [4] cannot broadcast")));
  EXPECT_THAT([] { ops::mul(zeros({2, 3}), zeros({3, 2})); },
              ThrowsMessage<Error>(HasSubstr("mul: shapes [2, 3] and [3, 2] cannot broadcast")));
}

TEST(Errors, DtypeMismatchNamesBothDtypes) {
  EXPECT_THAT([] { ops::add(zeros({2}), zeros({2}, kFloat64)); },
              ThrowsMessage<Error>(HasSubstr("add: dtypes differ: [2] float32 and [2] float64")));
  EXPECT_THAT([] { ops::matmul(zeros({2, 2}), zeros({2, 2}, kBFloat16)); },
              ThrowsMessage<Error>(AllOf(HasSubstr("float32"), HasSubstr("bfloat16"))));
}

TEST(Errors, IndexOutOfRangeNamesTheIndexAndTheLimit) {
  EXPECT_THAT([] { ops::embedding(zeros({4, 3}), ids({1, 5})); },
              ThrowsMessage<Error>(HasSubstr("embedding: index 5 out of range for 4 rows (weight [4, 3])")));
  EXPECT_THAT([] { ops::embedding(zeros({4, 3}), zeros({2})); },
              ThrowsMessage<Error>(HasSubstr("embedding: indices must be int32 or int64")));
  EXPECT_THAT([] { ops::index_select(zeros({3}), 0, ids({3})); },
              ThrowsMessage<Error>(HasSubstr("index_select: index 3 out of range for size 3")));
  EXPECT_THAT([] { ops::gather(zeros({2, 3}), 1, ids({0, 1})); },
              ThrowsMessage<Error>(HasSubstr("gather: indices [2] must have the rank of input [2, 3]")));
}

TEST(Errors, CrossEntropyTargetOutOfRangeNamesRowAndClasses) {
  EXPECT_THAT([] { ops::cross_entropy(zeros({2, 5}), ids({0, 7})); },
              ThrowsMessage<Error>(HasSubstr("cross_entropy: target 7 at row 1 out of range for 5 classes")));
  EXPECT_THAT([] { ops::cross_entropy(zeros({2, 5}), ids({0, 1, 2})); },
              ThrowsMessage<Error>(HasSubstr("cross_entropy: targets [3] do not match logits [2, 5]")));
}

TEST(Errors, ShapeAndArgumentChecksOfTheNnOps) {
  EXPECT_THAT([] { ops::layer_norm(zeros({2, 4}), zeros({3}), Tensor()); },
              ThrowsMessage<Error>(HasSubstr("layer_norm: input [2, 4] float32 needs weight/bias of shape [4]")));
  EXPECT_THAT([] { ops::cat({zeros({2, 2}), zeros({3, 3})}, 0); },
              ThrowsMessage<Error>(HasSubstr("cat: tensor 1 has shape [3, 3], tensor 0 has [2, 2]")));
  EXPECT_THAT([] { ops::softmax(zeros({2}, kInt64)); },
              ThrowsMessage<Error>(HasSubstr("softmax: expected a floating tensor, got [2] int64")));
  EXPECT_THAT([] { ops::sum(zeros({2, 3}), {2}); },
              ThrowsMessage<Error>(HasSubstr("sum: dim 2 out of range for shape [2, 3]")));
  EXPECT_THAT([] { ops::causal_mask_fill(zeros({3}), 0); },
              ThrowsMessage<Error>(HasSubstr("causal_mask_fill: needs [..., T, S], got [3]")));
  PhiloxGenerator g;
  EXPECT_THAT([&] { ops::dropout(zeros({2}), 1.0, g); },
              ThrowsMessage<Error>(HasSubstr("dropout: p must be in [0, 1), got 1")));
}

// tensor/profile.h (bench_gpt_step --profile): each op's exclusive time, its
// calls and flops; nested scopes subtracted from the one around them; other
// threads and closed profiles record nothing.
TEST(OpProfile, RecordsExclusiveTimeCallsAndFlopsOfTheRecordingThreadOnly) {
  using namespace std::chrono_literals;
  Generator gen(1);
  Tensor x = ops::transpose(randn({4, 8}, gen), 0, 1);  // [8, 4], strided: linear copies it (a nested "copy")
  Tensor w = randn({3, 4}, gen);
  profile::start();
  ops::linear(x, w, Tensor());
  {
    profile::Scope outer("outer");
    std::this_thread::sleep_for(10ms);
    profile::Scope inner("inner");
    std::this_thread::sleep_for(30ms);
  }
  std::thread([] { profile::Scope elsewhere("another thread"); }).join();
  std::map<std::string, profile::Entry> p = profile::stop();
  ops::linear(x, w, Tensor());  // after stop(): not recorded anywhere

  ASSERT_EQ(p.count("linear fwd 8x4x3"), 1u);
  EXPECT_EQ(p["linear fwd 8x4x3"].calls, 1);
  EXPECT_DOUBLE_EQ(p["linear fwd 8x4x3"].flops, 2.0 * 8 * 4 * 3);
  EXPECT_GE(p["copy"].calls, 1) << "the strided input's copy inside linear";
  EXPECT_GE(p["inner"].seconds, 0.030);
  EXPECT_GE(p["outer"].seconds, 0.010);
  EXPECT_LT(p["outer"].seconds, 0.035) << "outer's time must exclude inner's 30 ms (with it: >= 40 ms)";
  EXPECT_EQ(p.count("another thread"), 0u);
  profile::start();
  EXPECT_TRUE(profile::stop().empty()) << "start() clears the last profile";
}
