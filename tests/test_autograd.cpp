// AutogradTest: every differentiable op in autograd/functions.h checked against
// central finite differences (tests/gradcheck.h), a few forward values against
// closed forms, and the engine's contract: backward for scalars and with explicit
// gradients, freed graphs, NoGradGuard, detach, retain_grad, zero_grad, in-place
// checks and low-precision gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "error_of.h"
#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/functions.h"
#include "gradcheck.h"
#include "tensor/grad_mode.h"

using namespace loom;
using namespace loom::autograd;
using loom::test::gradcheck;
using loom::test::leaf;
using loom::test::rand64;
using loom::test::randn64;

namespace {

using X = const TensorList&;  // the argument of every function under check

Tensor i64(std::initializer_list<double> v, Shape shape = {}) { return tensor(v, std::move(shape), kInt64); }

// Values in [lo, hi) with a random sign: kept away from 0 (relu's kink, log, sqrt, div).
Tensor away_from_zero(const Shape& shape, uint64_t seed, double lo = 0.2, double hi = 1.5) {
  Tensor mag = rand64(shape, seed, lo, hi);
  Tensor sign = ops::sub(ops::mul(ops::gt_scalar(rand64(shape, seed + 1000, -1, 1), 0.0), 2.0), ones(shape, kFloat64));
  return ops::mul(mag, sign);
}

using loom::test::error_of;

void expect_values(const Tensor& t, const std::vector<double>& want, double tol = 1e-12) {
  std::vector<double> got = t.to_vector<double>();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

}  // namespace

// ---- the checker itself --------------------------------------------------------

TEST(AutogradTest, GradcheckCatchesAWrongBackwardAndNamesTheElement) {
  // y = 2x with a backward that is wrong only at flat element 4 ([1, 1] of [2, 3]).
  auto wrong = [](X x) {
    return record("WrongBackward", {&x[0]}, ops::mul(x[0], 2.0), [](const TensorList& g) {
      Tensor gx = ops::clone(ops::mul(g[0], 2.0));
      gx.data<double>()[4] += 0.5;
      return TensorList{gx};
    });
  };
  ::testing::AssertionResult r = gradcheck(wrong, {leaf(randn64({2, 3}, 1))});
  EXPECT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("1 of 6 elements"), std::string::npos) << r.message();
  EXPECT_NE(std::string(r.message()).find("index [1, 1]"), std::string::npos) << r.message();
}

TEST(AutogradTest, GradcheckRejectsFloat32Inputs) {
  Tensor x = zeros({2});
  set_requires_grad(x);
  EXPECT_FALSE(gradcheck([](X x) { return x[0]; }, {x}));
}

// ---- arithmetic ------------------------------------------------------------------

TEST(AutogradTest, AddSubMulDivSameShape) {
  Tensor a = leaf(randn64({2, 3}, 1)), b = leaf(away_from_zero({2, 3}, 2));
  EXPECT_TRUE(gradcheck([](X x) { return add(x[0], x[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([](X x) { return sub(x[0], x[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([](X x) { return mul(x[0], x[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([](X x) { return div(x[0], x[1]); }, {a, b}));
}

TEST(AutogradTest, BinaryOpsBroadcastRowVector) {  // [2, 3] op [3] and [3] op [2, 3]
  Tensor a = leaf(randn64({2, 3}, 3)), b = leaf(away_from_zero({3}, 4));
  Tensor c = leaf(away_from_zero({2, 3}, 5));
  EXPECT_TRUE(gradcheck([](X x) { return add(x[0], x[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([](X x) { return sub(x[0], x[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([](X x) { return mul(x[0], x[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([](X x) { return div(x[0], x[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([](X x) { return sub(x[0], x[1]); }, {b, a}));
  EXPECT_TRUE(gradcheck([](X x) { return div(x[0], x[1]); }, {b, c}));
}

TEST(AutogradTest, BinaryOpsBroadcastColumnAgainstRow) {  // [2, 1] op [1, 3] -> [2, 3]
  Tensor a = leaf(randn64({2, 1}, 6)), b = leaf(away_from_zero({1, 3}, 7));
  EXPECT_TRUE(gradcheck([](X x) { return add(x[0], x[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([](X x) { return sub(x[0], x[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([](X x) { return mul(x[0], x[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([](X x) { return div(x[0], x[1]); }, {a, b}));
}

TEST(AutogradTest, BinaryOpsBroadcastZeroDimTensor) {  // [] op [2, 3]: the scalar's grad is a sum
  Tensor s = leaf(full({}, 1.7, kFloat64)), a = leaf(away_from_zero({2, 3}, 8));
  ASSERT_EQ(s.dim(), 0);
  EXPECT_TRUE(gradcheck([](X x) { return mul(x[0], x[1]); }, {s, a}));
  EXPECT_TRUE(gradcheck([](X x) { return div(x[0], x[1]); }, {s, a}));
  EXPECT_TRUE(gradcheck([](X x) { return sub(x[1], x[0]); }, {s, a}));
}

TEST(AutogradTest, BinaryOpWithOneInputNotRequiringGrad) {
  Tensor a = leaf(randn64({2, 3}, 9));
  Tensor c = away_from_zero({3}, 10);  // a constant
  EXPECT_TRUE(gradcheck([](X x) { return mul(x[0], x[1]); }, {a, c}));
  EXPECT_TRUE(gradcheck([](X x) { return div(x[1], x[0]); }, {leaf(away_from_zero({2, 3}, 11)), c}));
}

TEST(AutogradTest, SameTensorOnBothSides) {  // x * x, x / x + x: the two edges' gradients add
  Tensor a = leaf(away_from_zero({4}, 12));
  EXPECT_TRUE(gradcheck([](X x) { return mul(x[0], x[0]); }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return add(div(x[0], x[0]), mul(x[0], x[0])); }, {a}));
}

TEST(AutogradTest, ScalarVariantsAndOperators) {
  Tensor a = leaf(away_from_zero({2, 3}, 13)), b = leaf(away_from_zero({2, 3}, 14));
  EXPECT_TRUE(gradcheck([](X x) { return add(x[0], 2.5); }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return mul(x[0], -1.5); }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return x[0] + x[1]; }, {a, b}));
  EXPECT_TRUE(gradcheck([](X x) { return x[0] - x[1]; }, {a, b}));
  EXPECT_TRUE(gradcheck([](X x) { return x[0] * x[1]; }, {a, b}));
  EXPECT_TRUE(gradcheck([](X x) { return x[0] / x[1]; }, {a, b}));
  EXPECT_TRUE(gradcheck([](X x) { return x[0] + 2.0; }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return 2.0 + x[0]; }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return x[0] - 2.0; }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return 2.0 - x[0]; }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return x[0] * 3.0; }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return 3.0 * x[0]; }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return x[0] / 4.0; }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return -x[0]; }, {a}));
}

// ---- unary math ------------------------------------------------------------------

TEST(AutogradTest, UnaryMath) {
  Tensor a = leaf(randn64({2, 3}, 15));
  Tensor pos = leaf(rand64({2, 3}, 16, 0.3, 2.0));
  EXPECT_TRUE(gradcheck([](X x) { return neg(x[0]); }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return exp(x[0]); }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return log(x[0]); }, {pos}));
  EXPECT_TRUE(gradcheck([](X x) { return tanh(x[0]); }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return sqrt(x[0]); }, {pos}));
  EXPECT_TRUE(gradcheck([](X x) { return gelu(x[0]); }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return relu(x[0]); }, {leaf(away_from_zero({2, 3}, 17))}));
}

TEST(AutogradTest, PowWithIntegerFractionalAndNegativeExponents) {
  Tensor a = leaf(randn64({2, 3}, 18));
  Tensor pos = leaf(rand64({2, 3}, 19, 0.3, 2.0));
  EXPECT_TRUE(gradcheck([](X x) { return pow(x[0], 2.0); }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return pow(x[0], 3.0); }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return pow(x[0], 0.5); }, {pos}));
  EXPECT_TRUE(gradcheck([](X x) { return pow(x[0], -1.5); }, {pos}));
}

TEST(AutogradTest, ReluGradientIsTheStepFunction) {
  Tensor x = leaf(tensor({-2.0, -0.5, 0.5, 3.0}, {4}, kFloat64));
  backward(sum(relu(x)));
  expect_values(grad(x), {0, 0, 1, 1});
}

// ---- reductions ------------------------------------------------------------------

TEST(AutogradTest, SumAndMeanOverAll) {
  Tensor a = leaf(randn64({2, 3, 4}, 20));
  EXPECT_TRUE(gradcheck([](X x) { return sum(x[0]); }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return mean(x[0]); }, {a}));
}

TEST(AutogradTest, SumAndMeanOverDimsWithAndWithoutKeepdim) {
  Tensor a = leaf(randn64({2, 3, 4}, 21));
  for (bool keep : {false, true}) {
    for (std::vector<int64_t> dims : {std::vector<int64_t>{0}, {1}, {-1}, {0, 2}, {2, 0}, {0, 1, 2}}) {
      SCOPED_TRACE(::testing::Message() << "dims " << shape_str(dims) << " keepdim " << keep);
      EXPECT_TRUE(gradcheck([dims, keep](X x) { return sum(x[0], dims, keep); }, {a}));
      EXPECT_TRUE(gradcheck([dims, keep](X x) { return mean(x[0], dims, keep); }, {a}));
    }
  }
}

TEST(AutogradTest, MaxOverDimRoutesGradientToTheArgmax) {
  Tensor a = leaf(randn64({3, 4, 5}, 22));  // distinct values: no ties within eps
  for (bool keep : {false, true})
    for (int64_t dim : {0, 1, 2, -1}) {
      SCOPED_TRACE(::testing::Message() << "dim " << dim << " keepdim " << keep);
      EXPECT_TRUE(gradcheck([dim, keep](X x) { return max(x[0], dim, keep); }, {a}));
    }
  // Closed form: only the argmax of each row gets the gradient.
  Tensor b = leaf(tensor({1, 5, 2, 7, 3, 4}, {2, 3}, kFloat64));
  backward(sum(max(b, 1)));
  expect_values(grad(b), {0, 1, 0, 1, 0, 0});
}

TEST(AutogradTest, MaxOverAll) {
  Tensor a = leaf(randn64({3, 4}, 23));
  EXPECT_TRUE(gradcheck([](X x) { return max(x[0]); }, {a}));
  Tensor b = leaf(tensor({1, 5, 2, 7, 3, 4}, {2, 3}, kFloat64));
  Tensor m = max(b);
  EXPECT_EQ(m.dim(), 0);
  EXPECT_EQ(m.item<double>(), 7.0);
  backward(m);
  expect_values(grad(b), {0, 0, 0, 1, 0, 0});
}

// ---- matmul ----------------------------------------------------------------------

TEST(AutogradTest, Matmul2D) {
  EXPECT_TRUE(gradcheck([](X x) { return matmul(x[0], x[1]); }, {leaf(randn64({3, 4}, 24)), leaf(randn64({4, 5}, 25))}));
}

TEST(AutogradTest, MatmulBatched3DAnd4D) {
  EXPECT_TRUE(gradcheck([](X x) { return matmul(x[0], x[1]); },
                        {leaf(randn64({2, 3, 4}, 26)), leaf(randn64({2, 4, 5}, 27))}));
  EXPECT_TRUE(gradcheck([](X x) { return matmul(x[0], x[1]); },
                        {leaf(randn64({2, 2, 3, 4}, 28)), leaf(randn64({2, 2, 4, 2}, 29))}));
}

TEST(AutogradTest, MatmulBroadcastBatchDims) {
  // [2, 1, 3, 4] @ [1, 2, 4, 5] and [3, 4] @ [2, 4, 5]: broadcast operands get summed gradients.
  EXPECT_TRUE(gradcheck([](X x) { return matmul(x[0], x[1]); },
                        {leaf(randn64({2, 1, 3, 4}, 30)), leaf(randn64({1, 2, 4, 5}, 31))}));
  EXPECT_TRUE(gradcheck([](X x) { return matmul(x[0], x[1]); },
                        {leaf(randn64({3, 4}, 32)), leaf(randn64({2, 4, 5}, 33))}));
}

TEST(AutogradTest, MatmulSharedWeightOverBatchAndTime) {  // [B, T, C] @ [C, D], a Linear layer
  EXPECT_TRUE(gradcheck([](X x) { return matmul(x[0], x[1]); },
                        {leaf(randn64({2, 3, 4}, 34)), leaf(randn64({4, 5}, 35))}));
  EXPECT_TRUE(gradcheck([](X x) { return matmul(x[0], x[1]); },
                        {leaf(randn64({2, 2, 3, 4}, 36)), leaf(randn64({4, 2}, 37))}));
}

TEST(AutogradTest, MatmulNonContiguousInputs) {
  // Transposed: a [3, 4] with strides [1, 3]; sliced: b [4, 5] out of a [4, 7] buffer.
  Tensor at = leaf(ops::transpose(randn64({4, 3}, 38), 0, 1));
  Tensor bs = leaf(ops::narrow(randn64({4, 7}, 39), 1, 1, 5));
  ASSERT_FALSE(at.is_contiguous());
  ASSERT_FALSE(bs.is_contiguous());
  EXPECT_TRUE(gradcheck([](X x) { return matmul(x[0], x[1]); }, {at, bs}));
  // A permuted [B, T, C] input against a transposed weight.
  Tensor xp = leaf(ops::permute(randn64({3, 2, 4}, 40), {1, 0, 2}));
  Tensor wt = leaf(ops::transpose(randn64({5, 4}, 41), 0, 1));
  EXPECT_TRUE(gradcheck([](X x) { return matmul(x[0], x[1]); }, {xp, wt}));
  // Only the weight requires grad (the input is data): the folded [B*T, C]^T @ [B*T, D] path.
  EXPECT_TRUE(gradcheck([](X x) { return matmul(x[0], x[1]); }, {randn64({2, 3, 4}, 85), leaf(randn64({4, 5}, 86))}));
  EXPECT_TRUE(gradcheck([](X x) { return matmul(x[0], x[1]); }, {xp, wt}));
  // Transposing inside f (the attention pattern q @ k^T).
  EXPECT_TRUE(gradcheck([](X x) { return matmul(x[0], transpose(x[1], -2, -1)); },
                        {leaf(randn64({2, 3, 4}, 42)), leaf(randn64({2, 5, 4}, 43))}));
}

TEST(AutogradTest, MatmulBothOperandsStoredTransposed) {
  // Both gradients take the transposed path (computed as (b gᵀ)ᵀ and (gᵀ a)ᵀ):
  // batched, 4-D with the heads of attention, and with broadcast batch dims.
  EXPECT_TRUE(gradcheck([](X x) { return matmul(transpose(x[0], -2, -1), transpose(x[1], -2, -1)); },
                        {leaf(randn64({2, 4, 3}, 87)), leaf(randn64({2, 5, 4}, 88))}));
  EXPECT_TRUE(gradcheck([](X x) { return matmul(transpose(x[0], -2, -1), transpose(x[1], -2, -1)); },
                        {leaf(randn64({2, 2, 4, 3}, 89)), leaf(randn64({2, 2, 5, 4}, 90))}));
  EXPECT_TRUE(gradcheck([](X x) { return matmul(transpose(x[0], -2, -1), transpose(x[1], -2, -1)); },
                        {leaf(randn64({2, 1, 4, 3}, 91)), leaf(randn64({1, 2, 5, 4}, 92))}));
  // Stored transposed as leaves (the input's own strides, not a transpose in f).
  Tensor at = leaf(ops::transpose(randn64({2, 4, 3}, 93), -2, -1));
  Tensor bt = leaf(ops::transpose(randn64({2, 5, 4}, 94), -2, -1));
  EXPECT_TRUE(gradcheck([](X x) { return matmul(x[0], x[1]); }, {at, bt}));
}

TEST(AutogradTest, MatmulGradientOfTransposedOperandKeepsItsLayout) {
  // q @ kᵀ in float32, k [B, H, T, hd]: dk comes out as [B, H, T, hd] rows (so
  // merging the heads copies whole rows) and equals the gradient computed
  // from a contiguous copy of kᵀ, transposed back.
  Tensor q = leaf(ops::to(randn64({2, 3, 6, 8}, 95), kFloat32));
  Tensor k = leaf(ops::to(randn64({2, 3, 6, 8}, 96), kFloat32));
  Tensor kt_copy = leaf(ops::contiguous(ops::transpose(detach(k), -2, -1)));
  Tensor g = ops::to(randn64({2, 3, 6, 6}, 97), kFloat32);
  backward(sum(matmul(q, transpose(k, -2, -1)) * g));
  backward(sum(matmul(detach(q), kt_copy) * g));
  Tensor dk = grad(k);
  EXPECT_TRUE(dk.is_contiguous());
  Tensor expected = ops::contiguous(ops::transpose(grad(kt_copy), -2, -1));
  ASSERT_EQ(dk.shape(), expected.shape());
  const float* a = dk.data<float>();
  const float* e = expected.data<float>();
  for (int64_t i = 0; i < dk.numel(); ++i) EXPECT_NEAR(a[i], e[i], 1e-6f * (1 + std::fabs(e[i]))) << "element " << i;
}

// ---- views and copies --------------------------------------------------------------

TEST(AutogradTest, ViewAndReshape) {
  Tensor a = leaf(randn64({2, 3, 4}, 44));
  EXPECT_TRUE(gradcheck([](X x) { return view(x[0], {6, 4}); }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return view(x[0], {-1}); }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return reshape(x[0], {4, -1}); }, {a}));
  // reshape of a non-contiguous input has to copy; the gradient still goes back through the view.
  Tensor t = leaf(ops::transpose(randn64({4, 3}, 45), 0, 1));
  EXPECT_TRUE(gradcheck([](X x) { return reshape(x[0], {12}); }, {t}));
}

TEST(AutogradTest, TransposeAndPermute) {
  Tensor a = leaf(randn64({2, 3, 4}, 46));
  EXPECT_TRUE(gradcheck([](X x) { return transpose(x[0], 0, 2); }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return transpose(x[0], -1, -2); }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return permute(x[0], {2, 0, 1}); }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return permute(x[0], {1, -1, 0}); }, {a}));
}

TEST(AutogradTest, NarrowPadsTheGradientWithZeros) {
  Tensor a = leaf(randn64({3, 5}, 47));
  EXPECT_TRUE(gradcheck([](X x) { return narrow(x[0], 1, 1, 3); }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return narrow(x[0], -2, 2, 1); }, {a}));
  Tensor b = leaf(zeros({4}, kFloat64));
  backward(sum(narrow(b, 0, 1, 2)));
  expect_values(grad(b), {0, 1, 1, 0});
}

TEST(AutogradTest, UnsqueezeSqueezeExpand) {
  Tensor a = leaf(randn64({2, 3}, 48));
  EXPECT_TRUE(gradcheck([](X x) { return unsqueeze(x[0], 0); }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return unsqueeze(x[0], -1); }, {a}));
  Tensor b = leaf(randn64({2, 1, 3}, 49));
  EXPECT_TRUE(gradcheck([](X x) { return squeeze(x[0], 1); }, {b}));
  EXPECT_TRUE(gradcheck([](X x) { return squeeze(x[0], 0); }, {b}));  // size 2: a no-op
  Tensor c = leaf(randn64({3, 1}, 50));
  EXPECT_TRUE(gradcheck([](X x) { return expand(x[0], {2, 3, 4}); }, {c}));
  EXPECT_TRUE(gradcheck([](X x) { return expand(x[0], {-1, 5}); }, {c}));
}

TEST(AutogradTest, ContiguousCloneAndSameDtypeTo) {
  Tensor t = leaf(ops::transpose(randn64({4, 3}, 51), 0, 1));
  Tensor a = leaf(randn64({2, 3}, 52));
  EXPECT_TRUE(gradcheck([](X x) { return contiguous(x[0]); }, {t}));
  EXPECT_TRUE(gradcheck([](X x) { return contiguous(x[0]); }, {a}));  // already contiguous
  EXPECT_TRUE(gradcheck([](X x) { return clone(x[0]); }, {t}));
  EXPECT_TRUE(gradcheck([](X x) { return to(x[0], kFloat64); }, {a}));
}

TEST(AutogradTest, ToConvertsTheGradientBackToTheInputDtype) {
  Tensor x = leaf(tensor({1, 2, 3}, {3}, kFloat32));
  Tensor y = to(x, kFloat64);
  EXPECT_EQ(y.dtype(), kFloat64);
  backward(sum(mul(y, tensor({0.5, -2, 4}, {3}, kFloat64))));
  ASSERT_TRUE(grad(x).defined());
  EXPECT_EQ(grad(x).dtype(), kFloat32);
  expect_values(grad(x), {0.5, -2, 4});
}

TEST(AutogradTest, CatSplitStack) {
  Tensor a = leaf(randn64({2, 3}, 53)), b = leaf(randn64({1, 3}, 54)), c = leaf(randn64({3, 3}, 55));
  EXPECT_TRUE(gradcheck([](X x) { return cat({x[0], x[1], x[2]}, 0); }, {a, b, c}));
  Tensor d = leaf(randn64({2, 2}, 56)), e = randn64({2, 1}, 57);  // e needs no grad
  EXPECT_TRUE(gradcheck([](X x) { return cat({x[0], x[1], x[2]}, -1); }, {a, d, e}));

  Tensor s = leaf(randn64({5, 3}, 58));
  // Parts of sizes 2, 2, 1, each used differently.
  EXPECT_TRUE(gradcheck(
      [](X x) {
        TensorList p = split(x[0], 2, 0);
        EXPECT_EQ(p.size(), 3u);
        return cat({mul(p[2], 2.0), p[0], mul(p[1], p[1])}, 0);
      },
      {s}));
  // An unused part gets zero gradient.
  EXPECT_TRUE(gradcheck([](X x) { return split(x[0], 2, 1)[1]; }, {s}));

  Tensor f = leaf(randn64({2, 3}, 59)), g = leaf(randn64({2, 3}, 60));
  EXPECT_TRUE(gradcheck([](X x) { return stack({x[0], x[1]}, 0); }, {f, g}));
  EXPECT_TRUE(gradcheck([](X x) { return stack({x[0], x[1], x[0]}, -1); }, {f, g}));
}

// ---- indexing --------------------------------------------------------------------

TEST(AutogradTest, IndexSelectWithRepeatedIndices) {
  Tensor a = leaf(randn64({4, 3}, 61));
  Tensor rows = i64({2, 0, 2, 3}), cols = i64({1, 1, 0});
  EXPECT_TRUE(gradcheck([rows](X x) { return index_select(x[0], 0, rows); }, {a}));
  EXPECT_TRUE(gradcheck([cols](X x) { return index_select(x[0], 1, cols); }, {a}));
  EXPECT_TRUE(gradcheck([cols](X x) { return index_select(x[0], -1, cols); }, {a}));
}

TEST(AutogradTest, Gather) {
  Tensor a = leaf(randn64({2, 3}, 62));
  Tensor idx1 = i64({0, 0, 2, 1, 2, 1, 2, 2}, {2, 4});  // along dim 1, repeats
  Tensor idx0 = i64({1, 0, 1, 1, 1, 0}, {2, 3});
  EXPECT_TRUE(gradcheck([idx1](X x) { return gather(x[0], 1, idx1); }, {a}));
  EXPECT_TRUE(gradcheck([idx0](X x) { return gather(x[0], 0, idx0); }, {a}));
  Tensor b = leaf(randn64({2, 3, 4}, 63));
  Tensor idx = i64({3, 0, 1, 3, 2, 2}, {2, 3, 1});  // picks one entry per row of the last dim
  EXPECT_TRUE(gradcheck([idx](X x) { return gather(x[0], -1, idx); }, {b}));
}

TEST(AutogradTest, WhereMaskedFillCausalMaskFill) {
  Tensor a = leaf(randn64({2, 3}, 64)), b = leaf(randn64({2, 3}, 65)), row = leaf(randn64({3}, 66));
  Tensor cond = tensor({1, 0, 1, 0, 0, 1}, {2, 3});
  EXPECT_TRUE(gradcheck([cond](X x) { return where(cond, x[0], x[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([cond](X x) { return where(cond, x[0], x[1]); }, {row, b}));  // broadcast a
  EXPECT_TRUE(gradcheck([cond](X x) { return where(cond, x[0], x[1]); }, {a, row}));  // broadcast b
  EXPECT_TRUE(gradcheck([cond](X x) { return masked_fill(x[0], cond, -5.0); }, {a}));
  Tensor col_mask = tensor({0, 1, 0}, {3});
  EXPECT_TRUE(gradcheck([col_mask](X x) { return masked_fill(x[0], col_mask, 2.0); }, {a}));

  // A moderate fill value: -1e9 would swamp sum(f(x) * R) and its finite differences.
  EXPECT_TRUE(gradcheck([](X x) { return causal_mask_fill(x[0], -3.0); }, {leaf(randn64({2, 3, 3}, 67))}));
  EXPECT_TRUE(gradcheck([](X x) { return causal_mask_fill(x[0], 0.0); }, {leaf(randn64({3, 4}, 68))}));
  Tensor s = leaf(zeros({2, 2}, kFloat64));
  backward(sum(causal_mask_fill(s, -1e9)));
  expect_values(grad(s), {1, 0, 1, 1});
}

// ---- neural-net ops ----------------------------------------------------------------

TEST(AutogradTest, SoftmaxAndLogSoftmax) {
  Tensor a = leaf(randn64({2, 3, 5}, 69));
  EXPECT_TRUE(gradcheck([](X x) { return softmax(x[0]); }, {a}));
  EXPECT_TRUE(gradcheck([](X x) { return log_softmax(x[0]); }, {a}));
  Tensor t = leaf(ops::transpose(randn64({5, 3}, 70), 0, 1));  // rows not contiguous
  EXPECT_TRUE(gradcheck([](X x) { return softmax(x[0]); }, {t}));
  EXPECT_TRUE(gradcheck([](X x) { return log_softmax(x[0]); }, {t}));
}

TEST(AutogradTest, CausalSoftmaxIsScaleMaskThenSoftmax) {
  // Scores [2, 2]: row 0 sees key 0 only; row 1 sees both, softmax of scale * [a, b].
  const double a = 0.3, b = -1.1, scale = 0.5;
  const double e0 = std::exp(scale * a), e1 = std::exp(scale * b);
  expect_values(causal_softmax(tensor({0.7, 2.0, a, b}, {2, 2}, kFloat64), scale),
                {1, 0, e0 / (e0 + e1), e1 / (e0 + e1)}, 1e-15);
  EXPECT_TRUE(gradcheck([](X x) { return causal_softmax(x[0], 0.7); }, {leaf(randn64({2, 3, 4}, 93))}));
  // More keys than queries, and rows longer than one 16-wide vector.
  EXPECT_TRUE(gradcheck([](X x) { return causal_softmax(x[0], 0.3); }, {leaf(randn64({20, 37}, 94))}));
}

TEST(AutogradTest, LinearIsInputTimesTransposedWeightPlusBias) {
  // [1, 2] @ [[1, 0], [0, 1], [1, 1]]ᵀ + [0.5, -1, 2] = [1.5, 1, 5]
  expect_values(linear(tensor({1, 2}, {1, 2}, kFloat64), tensor({1, 0, 0, 1, 1, 1}, {3, 2}, kFloat64),
                       tensor({0.5, -1, 2}, {3}, kFloat64)),
                {1.5, 1, 5});
  Tensor x = leaf(randn64({2, 3, 4}, 95)), w = leaf(randn64({5, 4}, 96)), bias = leaf(randn64({5}, 97));
  EXPECT_TRUE(gradcheck([](X x) { return linear(x[0], x[1], x[2]); }, {x, w, bias}));
  EXPECT_TRUE(gradcheck([](X x) { return linear(x[0], x[1], Tensor()); }, {x, w}));
  // The input is data (no grad), and a transposed (non-contiguous) input.
  EXPECT_TRUE(gradcheck([](X x) { return linear(x[0], x[1], x[2]); }, {randn64({3, 4}, 98), w, bias}));
  Tensor xt = leaf(ops::transpose(randn64({4, 3}, 99), 0, 1));
  EXPECT_TRUE(gradcheck([](X x) { return linear(x[0], x[1], x[2]); }, {xt, w, bias}));
}

// linear_gelu (the MLP's c_fc and GELU, one op) against the two ops it fuses:
// its gradient by finite differences, and on the CPU the same bits forward and
// backward, through the same two nodes (what it keeps and every moment of the
// backward are the composition's), in fp32 and bf16, with and without a bias.
TEST(AutogradTest, LinearGeluIsGeluOfLinearBitForBit) {
  Tensor x = leaf(randn64({2, 3, 4}, 101)), w = leaf(randn64({5, 4}, 102)), bias = leaf(randn64({5}, 103));
  EXPECT_TRUE(gradcheck([](X x) { return linear_gelu(x[0], x[1], x[2]); }, {x, w, bias}));
  EXPECT_TRUE(gradcheck([](X x) { return linear_gelu(x[0], x[1], Tensor()); }, {x, w}));
  auto same_bits = [](const Tensor& a, const Tensor& b) { return a.to_vector<double>() == b.to_vector<double>(); };
  for (DType dt : {kFloat32, kBFloat16}) {
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (with_bias ? " with bias" : " without bias"));
      Generator gen(104);
      const Tensor x0 = randn({3, 7, 16}, gen, dt), w0 = randn({24, 16}, gen, dt, 0.0, 0.3),
                   b0 = randn({24}, gen, dt), dy = randn({3, 7, 24}, gen, dt);
      TensorList grads[2], outs[2];
      for (int fused = 0; fused < 2; ++fused) {
        Tensor xi = leaf(ops::clone(x0)), wi = leaf(ops::clone(w0)), bi = with_bias ? leaf(ops::clone(b0)) : Tensor();
        Tensor y = fused ? linear_gelu(xi, wi, bi) : gelu(linear(xi, wi, bi));
        EXPECT_EQ(grad_fn(y)->name(), "GeluBackward");
        EXPECT_EQ(grad_fn(y)->next_edges[0].fn->name(), "LinearBackward");
        backward({y}, {dy});
        outs[fused] = {y};
        grads[fused] = {grad(xi), grad(wi), with_bias ? grad(bi) : Tensor()};
      }
      EXPECT_TRUE(same_bits(outs[1][0], outs[0][0])) << "y";
      for (int i = 0; i < (with_bias ? 3 : 2); ++i) EXPECT_TRUE(same_bits(grads[1][i], grads[0][i])) << "grad " << i;
    }
  }
}

TEST(AutogradTest, ReductionsAndIndexingOfNonContiguousInputs) {
  Tensor t = leaf(ops::permute(randn64({4, 2, 3}, 87), {1, 2, 0}));  // [2, 3, 4], not contiguous
  ASSERT_FALSE(t.is_contiguous());
  EXPECT_TRUE(gradcheck([](X x) { return sum(x[0], {1}, false); }, {t}));
  EXPECT_TRUE(gradcheck([](X x) { return mean(x[0], {0, 2}, true); }, {t}));
  EXPECT_TRUE(gradcheck([](X x) { return max(x[0], 1, true); }, {t}));
  EXPECT_TRUE(gradcheck([](X x) { return layer_norm(x[0], Tensor(), Tensor()); }, {t}));
  Tensor idx = i64({2, 0, 2});
  EXPECT_TRUE(gradcheck([idx](X x) { return index_select(x[0], 1, idx); }, {t}));
  Tensor gidx = i64({0, 3, 1, 1, 2, 0}, {2, 3, 1});
  EXPECT_TRUE(gradcheck([gidx](X x) { return gather(x[0], 2, gidx); }, {t}));
  Tensor logits = leaf(ops::transpose(randn64({5, 3}, 88), 0, 1));
  Tensor targets = tensor({4, 0, 2}, {3}, kInt32);  // int32 targets work too
  EXPECT_TRUE(gradcheck([targets](X x) { return cross_entropy(x[0], targets); }, {logits}));
}

TEST(AutogradTest, LayerNormInputWeightAndBias) {
  Tensor x = leaf(randn64({2, 3, 5}, 71)), w = leaf(randn64({5}, 72)), b = leaf(randn64({5}, 73));
  EXPECT_TRUE(gradcheck([](X v) { return layer_norm(v[0], v[1], v[2]); }, {x, w, b}));
  EXPECT_TRUE(gradcheck([](X v) { return layer_norm(v[0], v[1], Tensor()); }, {x, w}));
  EXPECT_TRUE(gradcheck([](X v) { return layer_norm(v[0], Tensor(), Tensor()); }, {x}));
  EXPECT_TRUE(gradcheck([](X v) { return layer_norm(v[0], v[1], v[2]); }, {randn64({4, 5}, 74), w, b}));
}

TEST(AutogradTest, EmbeddingSumsGradientsOfRepeatedIndices) {
  Tensor w = leaf(randn64({5, 3}, 75));
  Tensor idx = i64({1, 3, 1, 0, 3, 1}, {2, 3});
  EXPECT_TRUE(gradcheck([idx](X x) { return embedding(x[0], idx); }, {w}));
  Tensor idx32 = tensor({4, 4, 2}, {3}, kInt32);
  EXPECT_TRUE(gradcheck([idx32](X x) { return embedding(x[0], idx32); }, {w}));
  // With an all-ones upstream gradient row r of dW is (count of r in idx) * ones.
  Tensor w2 = leaf(randn64({5, 3}, 76));
  backward(sum(embedding(w2, idx)));
  expect_values(grad(w2), {1, 1, 1, 3, 3, 3, 0, 0, 0, 2, 2, 2, 0, 0, 0});
}

TEST(AutogradTest, CrossEntropyWithIgnoreIndex) {
  Tensor logits = leaf(randn64({4, 5}, 77));
  Tensor t = i64({1, -100, 3, 0});
  EXPECT_TRUE(gradcheck([t](X x) { return cross_entropy(x[0], t); }, {logits}));
  Tensor t3 = i64({1, 3, 3, 0});
  EXPECT_TRUE(gradcheck([t3](X x) { return cross_entropy(x[0], t3, 3); }, {logits}));
  // An ignored row gets exactly zero gradient.
  Tensor l2 = leaf(randn64({4, 5}, 78));
  backward(cross_entropy(l2, t));
  std::vector<double> g = grad(l2).to_vector<double>();
  for (int c = 0; c < 5; ++c) EXPECT_EQ(g[size_t(5 + c)], 0.0);
}

TEST(AutogradTest, DropoutWithTheSameMaskEveryCall) {
  // A fresh generator (offset 0) inside f gives the same mask on every evaluation.
  Tensor a = leaf(randn64({4, 6}, 79));
  EXPECT_TRUE(gradcheck([](X x) { PhiloxGenerator g{7}; return dropout(x[0], 0.3, g); }, {a}));
  // Kept entries are scaled by 1/(1-p), dropped ones are 0; the gradient is the same mask.
  Tensor b = leaf(ones({4, 6}, kFloat64));
  PhiloxGenerator g{7};
  Tensor y = dropout(b, 0.25, g);
  backward(sum(y));
  std::vector<double> yv = y.to_vector<double>(), gv = grad(b).to_vector<double>();
  int kept = 0;
  for (size_t i = 0; i < yv.size(); ++i) {
    EXPECT_TRUE(yv[i] == 0.0 || std::abs(yv[i] - 1.0 / 0.75) < 1e-12) << yv[i];
    EXPECT_EQ(gv[i], yv[i]);
    kept += yv[i] != 0.0;
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, 24);
  // Not training, or p = 0: identity.
  PhiloxGenerator g2{7};
  expect_values(dropout(b, 0.5, g2, /*training=*/false), std::vector<double>(24, 1.0));
}

// ---- composite forward values against closed forms ---------------------------------

TEST(AutogradTest, PolynomialForwardAndGradient) {
  // L = sum(x^2 + 2x) at x = [1, 2, 3]: 3 + 8 + 15 = 26; dL/dx = 2x + 2.
  Tensor x = leaf(tensor({1, 2, 3}, {3}, kFloat64));
  Tensor loss = sum(x * x + 2.0 * x);
  EXPECT_DOUBLE_EQ(loss.item<double>(), 26.0);
  backward(loss);
  expect_values(grad(x), {4, 6, 8});
}

TEST(AutogradTest, LinearTanhMeanForwardAndGradient) {
  // L = mean(tanh(w * x + b)), x = [0, 1], w = 0.5, b = 0.25.
  Tensor x = tensor({0, 1}, {2}, kFloat64);
  Tensor w = leaf(full({}, 0.5, kFloat64)), b = leaf(full({}, 0.25, kFloat64));
  Tensor loss = mean(tanh(w * x + b));
  double t0 = std::tanh(0.25), t1 = std::tanh(0.75);
  EXPECT_NEAR(loss.item<double>(), (t0 + t1) / 2, 1e-15);
  backward(loss);
  EXPECT_NEAR(grad(w).item<double>(), (1 - t1 * t1) / 2, 1e-15);
  EXPECT_NEAR(grad(b).item<double>(), ((1 - t0 * t0) + (1 - t1 * t1)) / 2, 1e-15);
}

TEST(AutogradTest, SoftmaxLayerNormCrossEntropyForwardValues) {
  // softmax([0, ln 2, ln 3]) = [1, 2, 3] / 6
  expect_values(softmax(tensor({0, std::log(2.0), std::log(3.0)}, {3}, kFloat64)), {1 / 6.0, 2 / 6.0, 3 / 6.0});
  // layer_norm([1, 2, 3]): mean 2, var 2/3 -> (x - 2) / sqrt(2/3 + eps)
  double r = 1 / std::sqrt(2.0 / 3.0 + 1e-5);
  expect_values(layer_norm(tensor({1, 2, 3}, {3}, kFloat64), Tensor(), Tensor()), {-r, 0, r});
  // Uniform logits over 4 classes: loss ln 4 whatever the targets.
  EXPECT_NEAR(cross_entropy(zeros({2, 4}, kFloat64), i64({1, 3})).item<double>(), std::log(4.0), 1e-15);
}

// ---- the engine ----------------------------------------------------------------------

TEST(AutogradTest, BackwardOfAScalarLossSeedsOne) {
  Tensor w = leaf(tensor({2, -1}, {2}, kFloat64));
  backward(sum(w * 3.0));
  expect_values(grad(w), {3, 3});
}

TEST(AutogradTest, BackwardWithExplicitGradientForANonScalar) {
  Tensor x = leaf(tensor({1, 2, 3}, {3}, kFloat64));
  Tensor y = x * x;  // dy/dx = 2x
  backward({y}, {tensor({1, 0.5, -1}, {3}, kFloat64)});
  expect_values(grad(x), {2, 2, -6});
  // Two outputs sharing a leaf: their contributions add.
  Tensor z = leaf(tensor({1, 2}, {2}, kFloat64));
  backward({z * 2.0, z * z}, {tensor({1, 1}, {2}, kFloat64), tensor({1, 10}, {2}, kFloat64)});
  expect_values(grad(z), {2 + 2, 2 + 40});
}

TEST(AutogradTest, BackwardOfANonScalarWithoutGradientIsAnError) {
  Tensor x = leaf(randn64({3}, 80));
  Tensor y = x * 2.0;
  std::string msg = error_of([&] { backward(y); });
  EXPECT_NE(msg.find("backward"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("only for scalar outputs"), std::string::npos) << msg;
  // And a gradient of the wrong shape.
  msg = error_of([&] { backward({y}, {zeros({2}, kFloat64)}); });
  EXPECT_NE(msg.find("does not match"), std::string::npos) << msg;
  // And a gradient of the wrong dtype.
  msg = error_of([&] { backward({y}, {zeros({3}, kFloat32)}); });
  EXPECT_NE(msg.find("float32"), std::string::npos) << msg;
  EXPECT_NE(msg.find("float64"), std::string::npos) << msg;
}

TEST(AutogradTest, BackwardFromALeafAccumulatesTheGivenGradient) {
  Tensor w = leaf(tensor({1, 2}, {2}, kFloat64));
  backward({w}, {tensor({0.5, -1}, {2}, kFloat64)});
  expect_values(grad(w), {0.5, -1});
}

TEST(AutogradTest, DiamondGraphSumsGradientsOfASharedIntermediate) {
  // h feeds two branches; its node must wait for both and add them.
  EXPECT_TRUE(gradcheck(
      [](X x) {
        Tensor h = tanh(x[0]);
        return h * h + exp(h) * x[1];
      },
      {leaf(randn64({2, 3}, 83)), leaf(randn64({3}, 84))}));
}

TEST(AutogradTest, BackwardOfATensorWithoutGraphIsAnError) {
  std::string msg = error_of([] { backward(sum(ones({2}, kFloat64))); });
  EXPECT_NE(msg.find("does not require grad"), std::string::npos) << msg;
}

TEST(AutogradTest, SecondBackwardThroughAFreedGraphIsAnError) {
  Tensor x = leaf(tensor({1, 2}, {2}, kFloat64));
  Tensor loss = sum(exp(x));
  backward(loss);
  std::string msg = error_of([&] { backward(loss); });
  EXPECT_NE(msg.find("second time"), std::string::npos) << msg;
  EXPECT_NE(msg.find("retain_graph"), std::string::npos) << msg;
  EXPECT_FALSE(Engine::in_backward());  // the failed pass left no state behind
}

TEST(AutogradTest, BackwardFreesSavedTensorsUnlessRetainGraph) {
  // exp saves its output; once the intermediate's own handle is gone, only the
  // graph keeps that buffer alive, until backward releases it.
  Tensor x = leaf(tensor({1, 2}, {2}, kFloat64));
  for (bool retain : {false, true}) {
    std::weak_ptr<Storage> saved;
    Tensor loss;
    {
      Tensor h = exp(x);
      saved = h.storage();
      loss = sum(h * 2.0);
    }
    ASSERT_FALSE(saved.expired());
    backward(loss, retain);
    EXPECT_EQ(saved.expired(), !retain) << "retain_graph " << retain;
  }
}

TEST(AutogradTest, RetainGraphAllowsASecondBackwardAndGradientsAccumulate) {
  Tensor x = leaf(tensor({1, 2}, {2}, kFloat64));
  Tensor loss = sum(exp(x));
  backward(loss, /*retain_graph=*/true);
  expect_values(grad(x), {std::exp(1.0), std::exp(2.0)});
  backward(loss);
  expect_values(grad(x), {2 * std::exp(1.0), 2 * std::exp(2.0)});
}

TEST(AutogradTest, NoGradGuardRecordsNothing) {
  Tensor x = leaf(randn64({3}, 81));
  {
    NoGradGuard no_grad;
    Tensor y = exp(x) * 2.0 + x;
    EXPECT_FALSE(requires_grad(y));
    EXPECT_EQ(grad_fn(y), nullptr);
  }
  Tensor z = x * 2.0;  // recording resumes after the guard
  EXPECT_TRUE(requires_grad(z));
  EXPECT_NE(grad_fn(z), nullptr);
}

TEST(AutogradTest, DetachCutsTheGraphAndSharesStorage) {
  Tensor x = leaf(tensor({1, 2, 3}, {3}, kFloat64));
  Tensor y = x * x;
  Tensor d = detach(y);
  EXPECT_FALSE(requires_grad(d));
  EXPECT_TRUE(is_leaf(d));
  EXPECT_EQ(d.raw_data(), y.raw_data());
  // L = sum(detach(x^2) * x): dL/dx = x^2 only (no 2x * x term through the detached branch).
  backward(sum(d * x));
  expect_values(grad(x), {1, 4, 9});
}

TEST(AutogradTest, RetainGradKeepsTheGradientOfANonLeaf) {
  Tensor x = leaf(tensor({1, -2}, {2}, kFloat64));
  Tensor h = x * 3.0, k = h + 1.0;
  retain_grad(h);
  backward(sum(h * h + k));  // dL/dh = 2h + 1
  ASSERT_TRUE(grad(h).defined());
  expect_values(grad(h), {7, -11});
  EXPECT_FALSE(grad(k).defined());  // not retained
  expect_values(grad(x), {21, -33});
}

TEST(AutogradTest, ZeroGradSetsToNoneOrZeroesInPlace) {
  Tensor a = leaf(tensor({1, 2}, {2}, kFloat64)), b = leaf(tensor({3}, {1}, kFloat64));
  backward(sum(a * 2.0) + sum(b * 5.0));
  zero_grad({a, b});
  EXPECT_FALSE(grad(a).defined());
  EXPECT_FALSE(grad(b).defined());

  backward(sum(a * 2.0) + sum(b * 5.0));
  void* before = grad(a).raw_data();
  zero_grad({a, b}, /*set_to_none=*/false);
  ASSERT_TRUE(grad(a).defined());
  EXPECT_EQ(grad(a).raw_data(), before);  // the same buffer, zeroed
  expect_values(grad(a), {0, 0});
  expect_values(grad(b), {0});
  backward(sum(a * 2.0));  // accumulates into the zeroed buffer
  expect_values(grad(a), {2, 2});
  EXPECT_EQ(grad(a).raw_data(), before);
}

TEST(AutogradTest, InPlaceOnALeafThatRequiresGradNeedsNoGradGuard) {
  Tensor w = leaf(tensor({1, 2}, {2}, kFloat64));
  Tensor d = tensor({0.5, 0.5}, {2}, kFloat64);
  std::string msg = error_of([&] { ops::add_(w, d); });
  EXPECT_NE(msg.find("add_"), std::string::npos) << msg;
  EXPECT_NE(msg.find("leaf"), std::string::npos) << msg;
  EXPECT_NE(msg.find("NoGradGuard"), std::string::npos) << msg;
  expect_values(w, {1, 2});  // untouched
  {
    NoGradGuard no_grad;  // an optimizer step
    ops::add_(w, d, -2.0);
  }
  expect_values(w, {0, 1});
}

TEST(AutogradTest, SetRequiresGradOnAnIntegerTensorIsAnError) {
  Tensor ids = i64({1, 2, 3});
  std::string msg = error_of([&] { set_requires_grad(ids); });
  EXPECT_NE(msg.find("set_requires_grad"), std::string::npos) << msg;
  EXPECT_NE(msg.find("int64"), std::string::npos) << msg;
  EXPECT_FALSE(requires_grad(ids));
}

TEST(AutogradTest, SetRequiresGradOnANonLeafIsAnError) {
  Tensor x = leaf(randn64({2}, 82));
  std::string msg = error_of([&] { set_requires_grad(x * 2.0); });
  EXPECT_NE(msg.find("only leaf tensors"), std::string::npos) << msg;
}

TEST(AutogradTest, Bf16ParamsGetBf16Gradients) {
  // Small integers are exact in bf16, so the gradient values are exact too.
  Tensor x = tensor({1, 2, 3, 4, 5, 6}, {2, 3}, kBFloat16);
  Tensor w = leaf(tensor({1, 0, -1, 2, 0, 1}, {3, 2}, kBFloat16));
  Tensor b = leaf(zeros({2}, kBFloat16));
  backward(sum(matmul(x, w) + b));
  ASSERT_TRUE(grad(w).defined());
  EXPECT_EQ(grad(w).dtype(), kBFloat16);
  EXPECT_EQ(grad(b).dtype(), kBFloat16);
  // dL/dW[k, n] = sum_m x[m, k]: column sums of x [5, 7, 9], repeated over n.
  expect_values(grad(w), {5, 5, 7, 7, 9, 9});
  expect_values(grad(b), {2, 2});

  // A bf16 param used through an fp32 copy (mixed precision) still gets a bf16 gradient.
  Tensor v = leaf(tensor({1, 2}, {2}, kBFloat16));
  backward(sum(to(v, kFloat32) * tensor({3, 4}, {2}, kFloat32)));
  EXPECT_EQ(grad(v).dtype(), kBFloat16);
  expect_values(grad(v), {3, 4});
}
