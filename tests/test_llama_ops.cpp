// LlamaOpsTest: the three ops Llama adds to GPT-2's (RMSNorm, rotary position
// embeddings, SiLU): each gradient checked against finite differences
// (tests/gradcheck.h), each forward against its definition written with other
// ops, and the float32 path (the fp32 kernels) against the float64 one.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/functions.h"
#include "error_of.h"
#include "gradcheck.h"

using namespace loom;
using namespace loom::autograd;
using loom::test::gradcheck;
using loom::test::leaf;
using loom::test::randn64;

namespace {

using X = const TensorList&;

double max_abs_diff(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

// transformers' apply_rotary_pos_emb for x [..., T, hd] at positions pos0 + t,
// written with plain ops: x cos + rotate_half(x) sin, rotate_half(x) = [-x2, x1],
// cos/sin [T, hd] = the angles of cat(freqs, freqs).
Tensor rope_by_definition(const Tensor& x, double base, int64_t pos0) {
  const int64_t T = x.size(-2), hd = x.size(-1), h = hd / 2;
  std::vector<double> c(size_t(T * hd)), s(size_t(T * hd));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < hd; ++i) {
      const double a = double(pos0 + t) * std::pow(base, -2.0 * double(i % h) / double(hd));
      c[size_t(t * hd + i)] = std::cos(a);
      s[size_t(t * hd + i)] = std::sin(a);
    }
  Tensor cos = from_vector(c, {T, hd}), sin = from_vector(s, {T, hd});  // float64
  TensorList halves = split(x, h, -1);
  Tensor rotated = cat({neg(halves[1]), halves[0]}, -1);
  return x * cos + rotated * sin;
}

}  // namespace

TEST(LlamaOpsTest, RMSNormGradientsOfInputAndWeight) {
  Tensor x = leaf(randn64({2, 3, 5}, 301)), w = leaf(randn64({5}, 302));
  EXPECT_TRUE(gradcheck([](X v) { return rms_norm(v[0], v[1]); }, {x, w}));
  EXPECT_TRUE(gradcheck([](X v) { return rms_norm(v[0], Tensor()); }, {x}));
  Tensor strided = leaf(ops::transpose(randn64({5, 4}, 303), 0, 1));  // [4, 5], not contiguous
  EXPECT_TRUE(gradcheck([](X v) { return rms_norm(v[0], v[1], 1e-6); }, {strided, w}));
}

TEST(LlamaOpsTest, RMSNormIsXOverRootMeanSquareTimesWeight) {
  Tensor x = randn64({3, 7}, 304), w = randn64({7}, 305);
  // weight * x / sqrt(mean(x²) + eps), LlamaRMSNorm's forward.
  Tensor want = w * x / sqrt(mean(x * x, {-1}, true) + 1e-5);
  EXPECT_LT(max_abs_diff(rms_norm(x, w, 1e-5), want), 1e-14);
  // The fp32 kernel against the double one.
  Tensor got32 = rms_norm(ops::to(x, kFloat32), ops::to(w, kFloat32), 1e-5);
  EXPECT_EQ(got32.dtype(), kFloat32);
  EXPECT_LT(max_abs_diff(got32, want), 1e-5);
}

TEST(LlamaOpsTest, RoPEMatchesTransformersRotateHalf) {
  Tensor x = randn64({2, 3, 6, 8}, 306);  // [B, H, T, hd]
  for (double base : {10000.0, 500000.0})
    for (int64_t pos0 : {0, 5}) {
      const Tensor want = rope_by_definition(x, base, pos0);
      EXPECT_LT(max_abs_diff(rope(x, base, pos0), want), 1e-13) << "base " << base << " pos0 " << pos0;
      EXPECT_LT(max_abs_diff(rope(ops::to(x, kFloat32), base, pos0), want), 1e-5);
    }
  // Position 0 is not rotated; the rotation keeps each pair's length.
  Tensor first = ops::narrow(x, 2, 0, 1);
  EXPECT_LT(max_abs_diff(rope(first, 10000.0), first), 1e-15);
}

TEST(LlamaOpsTest, RoPEGradientIsTheInverseRotation) {
  Tensor x = leaf(randn64({2, 2, 5, 6}, 307));
  EXPECT_TRUE(gradcheck([](X v) { return rope(v[0], 500000.0); }, {x}));
  EXPECT_TRUE(gradcheck([](X v) { return rope(v[0], 10000.0, 3); }, {x}));
  // A transposed view ([B, T, H, hd] -> [B, H, T, hd]), as attention passes q and k.
  Tensor heads = leaf(ops::transpose(randn64({1, 4, 2, 6}, 308), 1, 2));
  EXPECT_TRUE(gradcheck([](X v) { return rope(v[0], 100.0); }, {heads}));
}

TEST(LlamaOpsTest, RoPERefusesAnOddHeadSize) {
  EXPECT_NE(test::error_of([] { rope(randn64({2, 3, 5}, 309), 10000.0); }).find("even head size"), std::string::npos);
}

TEST(LlamaOpsTest, SiLUValuesAndGradient) {
  Tensor x = randn64({4, 5}, 310);
  Tensor want = x / (exp(neg(x)) + 1.0);  // x sigmoid(x)
  EXPECT_LT(max_abs_diff(silu(x), want), 1e-14);
  EXPECT_LT(max_abs_diff(silu(ops::to(x, kFloat32)), want), 1e-6);
  EXPECT_TRUE(gradcheck([](X v) { return silu(v[0]); }, {leaf(x)}));
  // SwiGLU's product: silu(gate) * up, both inputs checked.
  EXPECT_TRUE(gradcheck([](X v) { return silu(v[0]) * v[1]; }, {leaf(randn64({3, 4}, 311)), leaf(randn64({3, 4}, 312))}));
}
