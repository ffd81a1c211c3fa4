// Flash attention's algorithm on the CPU: ops::flash_attention runs the CUDA
// kernels' per-tile math (tensor/kernels/flash_attention.h) tile by tile in
// their order, with their tile sizes (query blocks of 64, key tiles of 32,
// query tiles of 16), so these tests check what the GPU computes: tiling,
// the online softmax's max correction, the causal mask on the diagonal tile,
// the log-sum-exp, and the backward's P = exp(S - L), dS = P (dP - D).
// The reference is nn::attend (the composition, or the CPU's fused op that
// tests/test_attention.cpp holds to it), forward and backward through
// autograd, on T not a multiple of any tile, several heads, strided q, k, v
// as the attention module makes them, and hd padded (24 -> 32) or not (64).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "autograd/engine.h"
#include "autograd/flash_attention.h"
#include "autograd/functions.h"
#include "autograd/variable.h"
#include "error_of.h"
#include "gradcheck.h"
#include "nn/attention.h"
#include "tensor/generator.h"
#include "tensor/ops.h"
#include "attention_inputs.h"
#include "relative_error.h"

using namespace loom;
using loom::test::make_qkv;
using loom::test::Outputs;
using loom::test::expect_outputs_match;
using loom::test::run_attention;
using loom::test::Qkv;
using loom::test::relative_error;
using autograd::TensorList;
using loom::test::error_of;

namespace {

// Flash attention or nn::attend.
Outputs run(const Qkv& in, bool flash, uint64_t seed) {
  if (flash) return run_attention(in, autograd::flash_attention, seed);
  return run_attention(in, [](const Tensor& q, const Tensor& k, const Tensor& v, double) {
    return nn::attend(q, k, v, nullptr);
  }, seed);
}


struct Case {
  int64_t B, H, T, hd;
};
// T = 1; 64 (one query block, two key tiles); 150 (three query blocks, the last
// 22 rows; five key tiles, the last 22 keys; ten query tiles, the last 6 rows);
// hd 24 (padded to 32) and 64 (HD itself).
const Case kCases[] = {{2, 3, 1, 8}, {1, 2, 64, 64}, {2, 3, 150, 24}, {1, 2, 150, 64}};

void expect_matches_attend(DType dt, double tol) {
  for (const Case& c : kCases)
    for (bool strided : {true, false}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " B=" << c.B << " H=" << c.H << " T=" << c.T
                                        << " hd=" << c.hd << (strided ? " strided" : " dense"));
      const uint64_t seed = uint64_t(c.T * 31 + c.hd);
      Outputs ref = run(make_qkv(c.B, c.H, c.T, c.hd, dt, strided, seed), false, 5);
      Outputs got = run(make_qkv(c.B, c.H, c.T, c.hd, dt, strided, seed), true, 5);
      expect_outputs_match(got, ref, tol);
    }
}

}  // namespace

TEST(FlashAttention, MatchesAttendInFloat64) { expect_matches_attend(kFloat64, 1e-12); }

// fp32: measured (2026-11-27) at most 7.6e-7 relative (float64: 1.0e-15).
TEST(FlashAttention, MatchesAttendInFloat32) { expect_matches_attend(kFloat32, 1e-6); }

// bf16/fp16 inputs, fp32 inside, o and the gradients rounded once. The
// composition rounds the scores, the weights and the products to bf16/fp16
// as it goes, so it is the less accurate of the two. Against the float64
// answer on the same (rounded) inputs, measured (2026-11-27) relative to the
// largest element, in units of 2^-8 (bf16) or 2^-11 (fp16): flash attention
// 0.55-0.64 (fp16: 0.34-1.07), the composition 1.07-1.41 (fp16: 0.64-1.56);
// flash against the composition 1.13-1.35 (fp16: 0.68-1.36).
TEST(FlashAttention, HalfInputsAreNearerTheExactAnswerThanTheComposition) {
  for (DType dt : {kBFloat16, kFloat16}) {
    const Case c{2, 3, 150, 24};
    Outputs flash = run(make_qkv(c.B, c.H, c.T, c.hd, dt, true, 7), true, 5);
    Outputs comp = run(make_qkv(c.B, c.H, c.T, c.hd, dt, true, 7), false, 5);
    // The float64 answer on the rounded values of the same inputs.
    Qkv in = make_qkv(c.B, c.H, c.T, c.hd, dt, true, 7);
    Qkv in64{autograd::set_requires_grad(ops::to(ops::contiguous(in.q), kFloat64)),
             autograd::set_requires_grad(ops::to(ops::contiguous(in.k), kFloat64)),
             autograd::set_requires_grad(ops::to(ops::contiguous(in.v), kFloat64)), Tensor()};
    Tensor o = nn::attend(in64.q, in64.k, in64.v, nullptr);
    Generator g(5);
    Tensor w = ops::to(randn(o.shape(), g, dt), kFloat64);  // run()'s w, in float64
    autograd::backward(autograd::sum(autograd::mul(o, w)));
    const Tensor exact[] = {o, autograd::grad(in64.q), autograd::grad(in64.k), autograd::grad(in64.v)};
    const Tensor got[] = {flash.out, flash.dq, flash.dk, flash.dv}, ref[] = {comp.out, comp.dq, comp.dk, comp.dv};
    const char* names[] = {"o", "dq", "dk", "dv"};
    const double unit = dt == kBFloat16 ? 1.0 / 256 : 1.0 / 2048;
    for (int i = 0; i < 4; ++i) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " " << names[i]);
      const double flash_err = relative_error(got[i], exact[i]), comp_err = relative_error(ref[i], exact[i]);
      EXPECT_LE(flash_err, 1.5 * unit);
      EXPECT_LE(comp_err, 2 * unit);
      EXPECT_LE(flash_err, comp_err);
      EXPECT_LE(relative_error(got[i], ref[i]), 2 * unit);
    }
  }
}

// L_i = log sum_{j <= i} exp(scale q_i · k_j), from the float64 scores.
TEST(FlashAttention, SavesEachRowsLogSumExp) {
  Generator g(3);
  const int64_t B = 2, H = 2, T = 100, hd = 20;
  const double scale = 0.3;
  Tensor q = randn({B, H, T, hd}, g, kFloat64), k = randn({B, H, T, hd}, g, kFloat64);
  Tensor v = randn({B, H, T, hd}, g, kFloat64);
  ops::FlashAttentionResult r = ops::flash_attention(q, k, v, scale);
  ASSERT_EQ(r.lse.shape(), Shape({B, H, T}));
  ASSERT_EQ(r.lse.dtype(), kFloat64);
  Tensor s = ops::matmul(q, ops::transpose(k, -2, -1));  // [B, H, T, T]
  std::vector<double> sv = s.to_vector<double>(), lse = r.lse.to_vector<double>();
  double worst = 0;
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t i = 0; i < T; ++i) {
      double m = -INFINITY, sum = 0;
      for (int64_t j = 0; j <= i; ++j) m = std::max(m, scale * sv[size_t((bh * T + i) * T + j)]);
      for (int64_t j = 0; j <= i; ++j) sum += std::exp(scale * sv[size_t((bh * T + i) * T + j)] - m);
      worst = std::max(worst, std::abs(lse[size_t(bh * T + i)] - (m + std::log(sum))));
    }
  EXPECT_LE(worst, 1e-12);
  // o is stored with heads merged, as the fused CPU op stores y.
  EXPECT_EQ(r.o.strides(), Shape({T * H * hd, hd, H * hd, 1}));
  // fp32 and half inputs keep a float32 lse.
  auto bf16 = [](const Tensor& x) { return ops::to(x, kBFloat16); };
  EXPECT_EQ(ops::flash_attention(bf16(q), bf16(k), bf16(v), scale).lse.dtype(), kFloat32);
}

TEST(FlashAttention, GradientMatchesFiniteDifferences) {
  using X = const TensorList&;
  auto f = [](X x) { return autograd::flash_attention(x[0], x[1], x[2], 0.6); };
  using test::leaf;
  using test::randn64;
  EXPECT_TRUE(test::gradcheck(
      f, {leaf(randn64({2, 2, 5, 3}, 11)), leaf(randn64({2, 2, 5, 3}, 12)), leaf(randn64({2, 2, 5, 3}, 13))}));
  // Two query blocks, three key tiles: keys of the first block get gradient from both.
  EXPECT_TRUE(test::gradcheck(
      f, {leaf(randn64({1, 1, 67, 2}, 14)), leaf(randn64({1, 1, 67, 2}, 15)), leaf(randn64({1, 1, 67, 2}, 16))}));
}

// Rows are independent and each adds in a fixed order: any thread count, the same bits.
TEST(FlashAttention, BitIdenticalAtOneAndTwoThreads) {
  const int before = ops::get_num_threads();
  Generator g(9);
  Tensor q = randn({2, 3, 100, 16}, g), k = randn({2, 3, 100, 16}, g), v = randn({2, 3, 100, 16}, g);
  Tensor dy = randn({2, 3, 100, 16}, g);
  auto once = [&](int threads) {
    ops::set_num_threads(threads);
    ops::FlashAttentionResult r = ops::flash_attention(q, k, v, 0.25);
    ops::FlashAttentionGrads d = ops::flash_attention_backward(dy, q, k, v, r.o, r.lse, 0.25);
    return std::vector<std::vector<float>>{r.o.to_vector<float>(), r.lse.to_vector<float>(), d.dq.to_vector<float>(),
                                           d.dk.to_vector<float>(), d.dv.to_vector<float>()};
  };
  auto one = once(1), two = once(2);
  ops::set_num_threads(before);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_EQ(one[i], two[i]) << "result " << i;
}

TEST(FlashAttention, UnsupportedInputsAreNamed) {
  Generator g(1);
  Tensor q = randn({1, 2, 4, 8}, g);
  EXPECT_EQ(ops::flash_attention_unsupported(q, q, q), "");
  EXPECT_NE(ops::flash_attention_unsupported(q, randn({1, 2, 5, 8}, g), q)
                .find("q, k, v must be [B, H, T, hd] of one shape, got [1, 2, 4, 8], [1, 2, 5, 8]"),
            std::string::npos);
  Tensor wide = randn({1, 2, 4, 65}, g);
  EXPECT_NE(ops::flash_attention_unsupported(wide, wide, wide).find("head size 65 (1 to 64"), std::string::npos);
  EXPECT_NE(ops::flash_attention_unsupported(q, ops::to(q, kBFloat16), q).find("differ in dtype or device"),
            std::string::npos);
  Tensor ids = zeros({1, 2, 4, 8}, kInt64);
  EXPECT_NE(error_of([&] { ops::flash_attention(ids, ids, ids, 1.0); }).find("flash_attention: dtype int64"),
            std::string::npos);
  ops::FlashAttentionResult r = ops::flash_attention(q, q, q, 1.0);
  EXPECT_NE(error_of([&] { ops::flash_attention_backward(q, q, q, q, r.o, zeros({1, 2, 5}), 1.0); })
                .find("lse [1, 2, 5] float32 is not the forward's [B, H, T]"),
            std::string::npos);
}

// No tokens: empty results of the right shapes, forward and backward.
TEST(FlashAttention, AnEmptySequenceGivesEmptyResults) {
  Tensor q = zeros({2, 3, 0, 4});
  ops::FlashAttentionResult r = ops::flash_attention(q, q, q, 0.5);
  EXPECT_EQ(r.o.shape(), Shape({2, 3, 0, 4}));
  EXPECT_EQ(r.lse.shape(), Shape({2, 3, 0}));
  ops::FlashAttentionGrads d = ops::flash_attention_backward(q, q, q, q, r.o, r.lse, 0.5);
  EXPECT_EQ(d.dk.shape(), Shape({2, 3, 0, 4}));
}

