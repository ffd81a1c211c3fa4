// The CPU step's fast paths against their readable references (issue 47):
// the AVX2 routing of weight-gradient GEMMs (tensor/cpu/gemm.h), and the bias
// added after the GEMM in linear (tensor/ops_linear.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tensor/cpu/gemm.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

using namespace loom;

namespace {

// max |got - want| <= rtol * max |want|, element by element.
void expect_close(const Tensor& got, const Tensor& want, double rtol, const char* what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  std::vector<double> g = ops::to(got, kFloat64).to_vector<double>(), w = ops::to(want, kFloat64).to_vector<double>();
  double scale = 0;
  for (double v : w) scale = std::max(scale, std::fabs(v));
  ASSERT_GT(scale, 0) << what;
  for (size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], w[i], rtol * scale) << what << ", element " << i;
}

}  // namespace

// Which products leave oneDNN: Aᵀ B only, at AVX2 only, and (at K = 1024)
// only where a row stride is a power of two of at least 512 floats (the small GPT's
// dW = gᵀ x with g [1024, 512] or x [1024, 512]).
TEST(GemmRouting, PowerOfTwoStridesOfAtLeast512LeaveOneDnnOnlyAtAvx2) {
  auto routed = [](bool avx512, bool ta, bool tb, int64_t M, int64_t N, int64_t lda, int64_t ldb) {
    return cpu::tn_goes_to_openblas(avx512, ta, tb, M, N, /*K=*/1024, lda, ldb);
  };
  EXPECT_TRUE(routed(/*avx512=*/false, true, false, 512, 128, 512, 128));  // fc's dW
  EXPECT_TRUE(routed(false, true, false, 128, 512, 128, 512));             // fc proj's dW
  EXPECT_TRUE(routed(false, true, false, 64, 128, 64, 2048));              // each thread's columns of a split
  EXPECT_FALSE(routed(true, true, false, 512, 128, 512, 128));             // AVX-512: oneDNN
  EXPECT_FALSE(routed(false, true, false, 384, 128, 384, 128));            // qkv's dW
  EXPECT_FALSE(routed(false, true, false, 1536, 384, 1536, 384));          // not a power of two
  EXPECT_FALSE(routed(false, true, false, 256, 128, 256, 128));            // too short to alias
  EXPECT_FALSE(routed(false, true, false, 8, 8, 512, 512));                // 0.1 MFLOP: too small to matter
  EXPECT_FALSE(routed(false, false, false, 512, 512, 512, 512));           // A B
  EXPECT_FALSE(routed(false, false, true, 512, 512, 512, 512));            // A Bᵀ
  EXPECT_FALSE(routed(false, true, true, 512, 512, 512, 512));             // Aᵀ Bᵀ
}

// A long inner dim leaves oneDNN at AVX2 whatever the strides: the medium
// GPT's weight gradients over its 2048 tokens (each thread's rows of fc's dW,
// qkv's), not K = 1024 (the small GPT's qkv, asserted above), nor a product
// with under 128 rows or columns (the head's 65 rows).
TEST(GemmRouting, InnerDimsOf2048LeaveOneDnnAtAvx2WhateverTheStrides) {
  EXPECT_TRUE(cpu::tn_goes_to_openblas(/*avx512=*/false, true, false, 768, 384, 2048, 1536, 384));  // fc's dW
  EXPECT_TRUE(cpu::tn_goes_to_openblas(false, true, false, 576, 384, 2048, 1152, 384));             // qkv's dW
  EXPECT_FALSE(cpu::tn_goes_to_openblas(false, true, false, 768, 384, 1024, 1536, 384));            // K 1024
  EXPECT_FALSE(cpu::tn_goes_to_openblas(false, true, false, 65, 384, 2048, 65, 384));               // the head's dW
  EXPECT_FALSE(cpu::tn_goes_to_openblas(true, true, false, 768, 384, 2048, 1536, 384));             // AVX-512
  EXPECT_FALSE(cpu::tn_goes_to_openblas(false, false, false, 768, 384, 2048, 1536, 384));           // A B
}

// A product routed by its K gives the fp64 product to fp32 rounding of
// K = 2048 dot products, on 1 and 2 threads.
TEST(GemmRouting, AMediumGptWeightGradientMatchesTheFloat64Product) {
  const int before = ops::get_num_threads();
  Generator gen(6);
  Tensor a = ops::transpose(randn({2048, 384}, gen), 0, 1), b = randn({2048, 96}, gen);  // Aᵀ B, lda 384, ldb 96
  for (int threads : {1, 2}) {
    ops::set_num_threads(threads);
    expect_close(ops::matmul(a, b), ops::matmul(ops::to(a, kFloat64), ops::to(b, kFloat64)), 1e-5,
                 threads == 1 ? "one thread" : "two threads");
  }
  ops::set_num_threads(before);
}

// The routed shapes give the fp64 product to fp32 rounding of K = 1024 dot
// products, on 1 and 2 threads (at AVX2 through OpenBLAS, else oneDNN).
TEST(GemmRouting, TheSmallGptsWeightGradientsMatchTheFloat64Product) {
  const int before = ops::get_num_threads();
  Generator gen(5);
  for (auto [m, n] : {std::pair<int64_t, int64_t>{512, 128}, {128, 512}}) {
    Tensor a = ops::transpose(randn({1024, m}, gen), 0, 1), b = randn({1024, n}, gen);  // Aᵀ B, lda m, ldb n
    for (int threads : {1, 2}) {
      ops::set_num_threads(threads);
      expect_close(ops::matmul(a, b), ops::matmul(ops::to(a, kFloat64), ops::to(b, kFloat64)), 1e-5,
                   threads == 1 ? "one thread" : "two threads");
    }
  }
  ops::set_num_threads(before);
}

// x [..., k] and the output width n of the linear tests below: odd sizes (vector tails), leading dims,
// the small GPT's fc [16, 64, 128] -> 512.
namespace {
struct LinearCase {
  Shape x;
  int64_t n;
};
const LinearCase kLinearCases[] = {{{1, 1}, 1}, {{7, 5}, 3}, {{2, 65, 33}, 70}, {{16, 64, 128}, 512}, {{3, 200, 17}, 129}};
}  // namespace

// linear with a bias in fp32: the GEMM with beta = 0, then the bias added to
// each row (tensor/ops_linear.cpp): the same bits as linear without a bias plus
// the bias, and x @ wᵀ + b in float64 to fp32 rounding; odd sizes, the small
// GPT's fc, leading dims, and two threads (rows split between them).
TEST(LinearBias, AddedAfterTheGemmIsTheProductPlusTheBias) {
  const int before = ops::get_num_threads();
  for (int threads : {1, 2}) {
    ops::set_num_threads(threads);
    for (const LinearCase& c : kLinearCases) {
      SCOPED_TRACE(::testing::Message() << "x [..., " << c.x.back() << "] in " << c.x.size() << " dims, n " << c.n
                                        << ", threads " << threads);
      Generator g(uint64_t(c.n * 7 + threads));
      Tensor x = randn(c.x, g), w = randn({c.n, c.x.back()}, g), b = randn({c.n}, g);
      Tensor y = ops::linear(x, w, b);
      const std::vector<float> want_bits = ops::add(ops::linear(x, w, Tensor()), b).to_vector<float>();
      EXPECT_EQ(y.to_vector<float>(), want_bits);
      Tensor ref = ops::add(ops::matmul(ops::to(x, kFloat64), ops::transpose(ops::to(w, kFloat64), 0, 1)),
                            ops::to(b, kFloat64));
      expect_close(y, ref, 1e-5, "linear against x @ wᵀ + b in float64");
    }
  }
  ops::set_num_threads(before);
}

// linear_gelu on the CPU: the GEMM without its bias, then one sweep adding the
// bias and applying GELU (tensor/cpu/bias_gelu.h): h and y the same bits as
// linear then gelu (the readable ops), fp32 and fp64, with and without a bias,
// odd sizes (vector tails), the small GPT's fc, and two threads (rows split).
TEST(LinearGelu, TheOneSweepGivesTheBitsOfLinearThenGelu) {
  const int before = ops::get_num_threads();
  for (int threads : {1, 2}) {
    ops::set_num_threads(threads);
    for (DType dt : {kFloat32, kFloat64}) {
      for (const LinearCase& c : kLinearCases) {
        for (bool with_bias : {true, false}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dt) << ", x [..., " << c.x.back() << "], n " << c.n
                                            << (with_bias ? ", bias" : ", no bias") << ", threads " << threads);
          Generator g(uint64_t(c.n * 11 + threads));
          Tensor x = randn(c.x, g, dt), w = randn({c.n, c.x.back()}, g, dt, 0.0, 0.5), b = randn({c.n}, g, dt);
          const Tensor bias = with_bias ? b : Tensor();
          const ops::LinearGeluResult got = ops::linear_gelu(x, w, bias);
          const Tensor h = ops::linear(x, w, bias);
          ASSERT_EQ(got.h.shape(), h.shape());
          ASSERT_EQ(got.y.shape(), h.shape());
          EXPECT_EQ(got.h.to_vector<double>(), h.to_vector<double>()) << "h";
          EXPECT_EQ(got.y.to_vector<double>(), ops::gelu(h).to_vector<double>()) << "y";
        }
      }
    }
  }
  ops::set_num_threads(before);
}
