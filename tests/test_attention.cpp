// The fused causal attention op (tensor/ops_attention.cpp) against its
// reference, the composition nn/attention.h writes out:
//   y = matmul(causal_softmax(matmul(q, kᵀ), scale), v)
// forward and every input's gradient, on shapes that end inside a block of 64
// query rows, span several blocks, or have one row; q, k, v as the attention
// module makes them (strided views of one [B, T, 3C] projection) and dense.
// Plus a finite-difference check in float64, the thread-count bit test, and
// the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "error_of.h"
#include "gradcheck.h"
#include "autograd/variable.h"
#include "nn/attention.h"
#include "tensor/generator.h"
#include "tensor/ops.h"
#include "tensor/profile.h"
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
using loom::test::gradcheck;

namespace {

// The composition the fused op replaces (nn/attention.h writes it out).
Tensor composition(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  return autograd::matmul(autograd::causal_softmax(autograd::matmul(q, autograd::transpose(k, -2, -1)), scale), v);
}

// The fused op or the composition it replaces.
Outputs run(const Qkv& in, bool fused, uint64_t seed) {
  return run_attention(in, fused ? loom::test::AttentionPath(autograd::causal_attention) : composition, seed);
}


}  // namespace

// T = 1, inside one block (5, 64), just past it (65), three blocks the last
// one partial (130), a longer head (T = 200, hd = 16), and heads too large
// for the next head's prefetch (T = 260, 5 blocks, 3 heads: the op fetches
// the next block's rows instead, and the next head's after a head's last);
// fp32 and fp64.
TEST(CausalAttention, MatchesTheCompositionForwardAndBackward) {
  struct Case {
    int64_t B, H, T, hd;
  };
  const Case cases[] = {{2, 3, 1, 4}, {2, 3, 5, 8}, {1, 2, 64, 32}, {2, 2, 65, 8}, {1, 3, 130, 12}, {1, 1, 200, 16},
                        {1, 3, 260, 16}};
  for (DType dt : {kFloat32, kFloat64}) {
    const double tol = dt == kFloat32 ? 2e-6 : 1e-13;
    for (const Case& c : cases)
      for (bool strided : {true, false}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " B=" << c.B << " H=" << c.H << " T=" << c.T
                                          << " hd=" << c.hd << (strided ? " strided" : " dense"));
        const uint64_t seed = uint64_t(c.T * 31 + c.hd);
        Outputs ref = run(make_qkv(c.B, c.H, c.T, c.hd, dt, strided, seed), false, 5);
        Outputs got = run(make_qkv(c.B, c.H, c.T, c.hd, dt, strided, seed), true, 5);
        expect_outputs_match(got, ref, tol);
      }
  }
}

// The saved probabilities are the reference's, zeros past the diagonal
// included, and y is stored with heads merged ([B, T, H, hd] in memory), so
// the module's reshape to [B, T, C] is a view.
TEST(CausalAttention, SavesTheProbabilitiesAndStoresHeadsMerged) {
  Generator g(3);
  const int64_t B = 2, H = 3, T = 70, hd = 4;
  Tensor q = randn({B, H, T, hd}, g), k = randn({B, H, T, hd}, g), v = randn({B, H, T, hd}, g);
  ops::CausalAttentionResult r = ops::causal_attention(q, k, v, 0.5);
  Tensor ref = ops::causal_softmax(ops::matmul(q, ops::transpose(k, -2, -1)), 0.5);
  EXPECT_LE(relative_error(r.att, ref), 1e-6);
  std::vector<float> att = r.att.to_vector<float>();
  size_t nonzero_future = 0;
  for (int64_t i = 0; i < B * H; ++i)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t s = t + 1; s < T; ++s) nonzero_future += att[size_t((i * T + t) * T + s)] != 0.0f;
  EXPECT_EQ(nonzero_future, 0u);
  EXPECT_EQ(r.y.shape(), Shape({B, H, T, hd}));
  EXPECT_EQ(r.y.strides(), Shape({T * H * hd, hd, H * hd, 1}));
  EXPECT_TRUE(ops::transpose(r.y, 1, 2).is_contiguous());
}

TEST(CausalAttention, GradientMatchesFiniteDifferences) {
  using X = const TensorList&;
  auto f = [](X x) { return autograd::causal_attention(x[0], x[1], x[2], 0.6); };
  using test::leaf;
  using test::randn64;
  EXPECT_TRUE(
      gradcheck(f, {leaf(randn64({2, 2, 5, 3}, 11)), leaf(randn64({2, 2, 5, 3}, 12)), leaf(randn64({2, 2, 5, 3}, 13))}));
  // Two blocks: keys of the first block get gradient from both.
  EXPECT_TRUE(gradcheck(f, {leaf(randn64({1, 1, 67, 2}, 14)), leaf(randn64({1, 1, 67, 2}, 15)),
                            leaf(randn64({1, 1, 67, 2}, 16))}));
}

// Threads take whole (batch, head) products: the same bits at 1 and 2 threads.
TEST(CausalAttention, BitIdenticalAtOneAndTwoThreads) {
  const int before = ops::get_num_threads();
  Generator g(9);
  Tensor q = randn({3, 4, 100, 16}, g), k = randn({3, 4, 100, 16}, g), v = randn({3, 4, 100, 16}, g);
  Tensor dy = randn({3, 4, 100, 16}, g);
  auto once = [&](int threads) {
    ops::set_num_threads(threads);
    ops::CausalAttentionResult r = ops::causal_attention(q, k, v, 0.25);
    ops::CausalAttentionGrads d = ops::causal_attention_backward(dy, q, k, v, r.att, 0.25);
    return std::vector<std::vector<float>>{r.y.to_vector<float>(), d.dq.to_vector<float>(), d.dk.to_vector<float>(),
                                           d.dv.to_vector<float>()};
  };
  auto one = once(1), two = once(2);
  ops::set_num_threads(before);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_EQ(one[i], two[i]) << "result " << i;
}

// q, k, v split from one [B, T, 3C] projection (as the module makes them): the op writes dq, dk, dv side by
// side in one buffer laid out as qkv, so split's backward hands that buffer on as qkv's gradient (no copy in
// the whole backward), and it equals the composition's gradient of qkv.
TEST(CausalAttention, QkvsGradientIsTheBackwardsOwnBufferNotACopy) {
  auto grad_of_qkv = [](bool fused, std::map<std::string, profile::Entry>* prof) {
    Qkv in = make_qkv(2, 3, 70, 8, kFloat32, /*strided=*/true, 31);
    Tensor y = (fused ? autograd::causal_attention : composition)(in.q, in.k, in.v, 0.35);
    Generator g(32);
    Tensor loss = autograd::sum(autograd::mul(y, randn(y.shape(), g)));
    if (prof) profile::start();
    autograd::backward(loss);
    if (prof) *prof = profile::stop();
    return autograd::grad(in.qkv);
  };
  std::map<std::string, profile::Entry> prof;
  Tensor got = grad_of_qkv(true, &prof), ref = grad_of_qkv(false, nullptr);
  EXPECT_EQ(prof.count("copy"), 0u) << prof["copy"].calls << " copies in the backward";
  EXPECT_EQ(prof.count("attention bwd"), 1u);  // the profile saw the backward
  EXPECT_LE(relative_error(got, ref), 1e-5);
}

// The module runs the fused op on CPU fp32 and the composition with attention
// dropout on: both with p = 0 must give the module's numbers to rounding.
TEST(CausalAttention, ModuleOutputMatchesTheCompositionWrittenOut) {
  Generator g(21);
  nn::CausalSelfAttention fused(16, 4, g, 0.02);
  Tensor x = randn({2, 70, 16}, g);
  Tensor y = fused.forward(x);
  // The same layer written out with the composition.
  const int64_t B = 2, T = 70, C = 16, H = 4, hd = 4;
  Tensor qkv = ops::linear(x, fused.c_attn->weight, fused.c_attn->bias);
  std::vector<Tensor> parts = ops::split(qkv, C, 2);
  auto heads = [&](const Tensor& t) { return ops::transpose(ops::reshape(t, {B, T, H, hd}), 1, 2); };
  Tensor att = ops::causal_softmax(ops::matmul(heads(parts[0]), ops::transpose(heads(parts[1]), -2, -1)), 0.5);
  Tensor merged = ops::reshape(ops::transpose(ops::matmul(att, heads(parts[2])), 1, 2), {B, T, C});
  Tensor ref = ops::linear(merged, fused.c_proj->weight, fused.c_proj->bias);
  EXPECT_LE(relative_error(y, ref), 2e-6);
}

TEST(CausalAttention, BadInputsAreNamed) {
  Generator g(1);
  Tensor q = randn({1, 2, 4, 8}, g);
  EXPECT_NE(error_of([&] { ops::causal_attention(q, randn({1, 2, 5, 8}, g), q, 1.0); })
                .find("q, k, v must be [B, H, T, hd] of one shape, got [1, 2, 4, 8], [1, 2, 5, 8]"),
            std::string::npos);
  Tensor h = ops::to(q, kBFloat16);
  EXPECT_NE(error_of([&] { ops::causal_attention(h, h, h, 1.0); }).find("must be float32 or float64"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::causal_attention(randn({2, 4, 8}, g), q, q, 1.0); }).find("[B, H, T, hd]"),
            std::string::npos);
}

// No tokens: empty results of the right shapes, forward and backward.
TEST(CausalAttention, AnEmptySequenceGivesEmptyResults) {
  Tensor q = zeros({2, 3, 0, 4});
  ops::CausalAttentionResult r = ops::causal_attention(q, q, q, 0.5);
  EXPECT_EQ(r.y.shape(), Shape({2, 3, 0, 4}));
  EXPECT_EQ(r.att.shape(), Shape({2, 3, 0, 0}));
  ops::CausalAttentionGrads d = ops::causal_attention_backward(q, q, q, q, r.att, 0.5);
  EXPECT_EQ(d.dk.shape(), Shape({2, 3, 0, 4}));
}
