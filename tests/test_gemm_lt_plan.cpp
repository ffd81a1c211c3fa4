// The cuBLASLt GEMM path's host logic (tensor/cuda/fast/gemm_lt_plan.h), on
// the CPU: linear's three GEMMs and matmul's batched ones mapped to
// cuBLASLt's column-major call, then run by a CPU model of what cuBLASLt
// documents for that call (cublasLt.h: D = op(A) op(B) + beta C; BIAS adds
// bias[i] to row i of D; BGRADB writes Σ_k op(B)[k, j] for column j of D;
// GELU_AUX_BIAS adds the bias, writes the sum to aux and GELU of it to D),
// against loom's own CPU ops in float64 (to 1e-12: only the order of the sums
// differs). Also the cache key and which dtypes take the path. No GPU needed;
// tests/cuda/test_cuda_gemm_lt.cpp runs cuBLASLt itself.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tensor/cuda/fast/gemm_lt_plan.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

using namespace loom;
using namespace loom::cuda;
using namespace loom::cuda::fast;

namespace {

Tensor random(const Shape& s, uint64_t seed, double std = 1.0) {
  Generator gen(seed);
  return randn(s, gen, kFloat64, 0.0, std);
}

// GELU as cuBLASLt documents it (the tanh form), written here from the formula, not from loom's kernel.
double gelu_tanh(double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); }

// cuBLASLt's documented semantics for plan p, column-major, in double; aux:
// where the GELU epilogues write GELU's input.
void run_model(const LtPlan& p, const double* A, const double* B, double* D, double* bias, double* aux = nullptr) {
  // The layouts must be what cuBLASLt accepts for op(A) [m, k], op(B) [k, n], D [m, n].
  ASSERT_EQ(p.a.rows, p.trans_a ? p.k : p.m);
  ASSERT_EQ(p.a.cols, p.trans_a ? p.m : p.k);
  ASSERT_EQ(p.b.rows, p.trans_b ? p.n : p.k);
  ASSERT_EQ(p.b.cols, p.trans_b ? p.k : p.n);
  ASSERT_EQ(p.d.rows, p.m);
  ASSERT_EQ(p.d.cols, p.n);
  for (const LtLayout* l : {&p.a, &p.b, &p.d}) ASSERT_GE(l->ld, l->rows);  // column-major: ld >= rows
  const bool adds_bias = p.epilogue == LtEpilogue::Bias || p.epilogue == LtEpilogue::GeluAuxBias;
  const bool gelu = p.epilogue == LtEpilogue::GeluAux || p.epilogue == LtEpilogue::GeluAuxBias;
  ASSERT_EQ(p.bias_len, adds_bias ? p.m : p.epilogue == LtEpilogue::BGradB ? p.n : 0);
  // GELU's aux: D's rows at least, a multiple of 8 (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD); no aux otherwise.
  if (gelu) ASSERT_TRUE(aux != nullptr && p.aux_ld >= p.m && p.aux_ld % 8 == 0 && p.batch == 1 && !p.beta_one);
  else ASSERT_EQ(p.aux_ld, 0);
  for (int64_t q = 0; q < p.batch; ++q) {
    const double* a = A + q * p.a.batch_stride;
    const double* b = B + q * p.b.batch_stride;
    double* d = D + q * p.d.batch_stride;
    auto op_a = [&](int64_t i, int64_t l) { return p.trans_a ? a[l + i * p.a.ld] : a[i + l * p.a.ld]; };
    auto op_b = [&](int64_t l, int64_t j) { return p.trans_b ? b[j + l * p.b.ld] : b[l + j * p.b.ld]; };
    for (int64_t j = 0; j < p.n; ++j) {
      for (int64_t i = 0; i < p.m; ++i) {
        double s = p.beta_one ? d[i + j * p.d.ld] : 0.0;
        for (int64_t l = 0; l < p.k; ++l) s += op_a(i, l) * op_b(l, j);
        if (adds_bias) s += bias[i];
        if (gelu) aux[i + j * p.aux_ld] = s;  // GELU's input, then D = GELU(s)
        d[i + j * p.d.ld] = gelu ? gelu_tanh(s) : s;
      }
      if (p.epilogue == LtEpilogue::BGradB) {
        double s = 0;
        for (int64_t l = 0; l < p.k; ++l) s += op_b(l, j);
        bias[j] = s;
      }
    }
  }
}

// One GEMM g through its plan and the model: cuBLASLt's A is loom's b, its B loom's a.
void run_plan(const Gemm& g, LtEpilogue e, double* bias, double* aux = nullptr) {
  const LtPlan p = lt_plan(kCPU, kFloat64, g, e, bias, aux);
  run_model(p, static_cast<const double*>(g.b), static_cast<const double*>(g.a), static_cast<double*>(g.c), bias,
            aux);
}

void expect_near(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.shape(), want.shape());
  const std::vector<double> a = got.to_vector<double>(), b = want.to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]) / (1 + std::fabs(b[i])));
  EXPECT_LT(worst, 1e-12);
}

// GPT shapes (tokens x C -> 3C, 4C, C; the head's vocabulary) and odd ones.
struct Shape3 {
  int64_t M, K, N;
};
const Shape3 kShapes[] = {{64, 32, 96}, {64, 128, 32}, {48, 16, 65}, {5, 7, 3}, {1, 9, 1}, {33, 1, 17}};

}  // namespace

TEST(GemmLtPlan, LinearForwardWithTheBiasEpilogueIsLinear) {
  for (const Shape3& s : kShapes) {
    Tensor x = random({s.M, s.K}, 1), w = random({s.N, s.K}, 2), b = random({s.N}, 3);
    for (bool with_bias : {true, false}) {
      Tensor out = empty({s.M, s.N}, kFloat64);
      run_plan(linear_gemm(s.M, s.N, s.K, x.raw_data(), w.raw_data(), out.raw_data()), forward_epilogue(with_bias),
               with_bias ? b.data<double>() : nullptr);
      expect_near(out, ops::linear(x, w, with_bias ? b : Tensor()));
    }
  }
}

// linear_gelu's one call (GELU_AUX_BIAS; GELU_AUX without a bias): y in D and
// h in aux are loom's two ops, linear then gelu. Widths that are multiples of
// 8 (aux's leading dimension), with GPT's and odd token and input counts.
TEST(GemmLtPlan, LinearGeluWithTheGeluAuxEpilogueIsLinearThenGelu) {
  const Shape3 shapes[] = {{64, 32, 128}, {64, 128, 32}, {48, 16, 64}, {5, 7, 8}, {1, 9, 8}, {33, 1, 16}};
  for (const Shape3& s : shapes) {
    // h ~ N(0, ~1.8): GELU's curved part, not just its linear tails.
    Tensor x = random({s.M, s.K}, 11, 1.5), w = random({s.N, s.K}, 12, 1 / std::sqrt(double(s.K)));
    Tensor b = random({s.N}, 13);
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "M " << s.M << " K " << s.K << " N " << s.N << " bias " << with_bias);
      const ops::LinearGeluResult want = ops::linear_gelu(x, w, with_bias ? b : Tensor());
      Tensor y = empty({s.M, s.N}, kFloat64), h = empty({s.M, s.N}, kFloat64);
      run_plan(linear_gemm(s.M, s.N, s.K, x.raw_data(), w.raw_data(), y.raw_data()), gelu_epilogue(with_bias),
               with_bias ? b.data<double>() : nullptr, h.data<double>());
      expect_near(h, want.h);
      expect_near(y, want.y);
    }
  }
}

// aux takes D's leading dimension, which cuBLASLt wants a multiple of 8:
// linear_gelu checks gelu_aux_fits before it asks for the plan, which refuses the rest.
TEST(GemmLtPlan, TheGeluEpilogueRefusesAWidthAuxCannotTake) {
  alignas(16) static uint16_t buf[4096];
  EXPECT_TRUE(gelu_aux_fits(3072));
  EXPECT_FALSE(gelu_aux_fits(65));
  const Gemm odd = linear_gemm(64, 65, 32, buf, buf + 1024, buf + 2048);
  EXPECT_THROW(lt_plan(kCPU, kBFloat16, odd, LtEpilogue::GeluAuxBias, buf + 3072, buf + 3200), Error);
  const Gemm g = linear_gemm(64, 96, 32, buf, buf + 1024, buf + 2048);
  EXPECT_THROW(lt_plan(kCPU, kBFloat16, g, LtEpilogue::GeluAuxBias, buf + 3072, nullptr), Error);  // no aux
  EXPECT_THROW(lt_plan(kCPU, kBFloat16, g, LtEpilogue::GeluAux, buf + 3072, buf + 3200), Error);   // a stray bias
  EXPECT_EQ(lt_plan(kCPU, kBFloat16, g, LtEpilogue::GeluAux, nullptr, buf + 3200).aux_ld, 96);
}

TEST(GemmLtPlan, LinearBackwardProductsAndTheBiasGradientEpilogueAreLinearBackward) {
  for (const Shape3& s : kShapes) {
    Tensor x = random({s.M, s.K}, 4), w = random({s.N, s.K}, 5), g = random({s.M, s.N}, 6);
    const ops::LinearGrads want = ops::linear_backward(g, x, w, true, true, true);
    Tensor dx = empty({s.M, s.K}, kFloat64), dw = empty({s.N, s.K}, kFloat64), db = empty({s.N}, kFloat64);
    run_plan(linear_dx_gemm(s.M, s.N, s.K, g.raw_data(), w.raw_data(), dx.raw_data()), LtEpilogue::None, nullptr);
    run_plan(linear_dw_gemm(s.M, s.N, s.K, g.raw_data(), x.raw_data(), dw.raw_data()), weight_grad_epilogue(true),
             db.data<double>());
    expect_near(dx, want.dx);
    expect_near(dw, want.dw);
    expect_near(db, want.db);
  }
}

// matmul's strided-batched form (gemm.cpp): a transposed view times a broadcast matrix, then beta = 1.
TEST(GemmLtPlan, BatchedTransposedAndBroadcastOperandsAreMatmul) {
  const int64_t B = 3, M = 5, K = 7, N = 4;
  Tensor a_stored = random({B, K, M}, 7), b = random({K, N}, 8), c0 = random({B, M, N}, 9);
  Gemm g;  // C [b] = a_stored[b]ᵀ @ b for each b
  g.ta = true, g.M = M, g.N = N, g.K = K;
  g.a = a_stored.raw_data(), g.lda = M, g.stride_a = K * M;
  g.b = b.raw_data(), g.ldb = N, g.stride_b = 0;
  Tensor c = ops::clone(c0);
  g.c = c.raw_data(), g.ldc = N, g.stride_c = M * N, g.batch = B, g.beta = 1;
  run_plan(g, LtEpilogue::None, nullptr);
  expect_near(c, ops::add(c0, ops::matmul(ops::transpose(a_stored, -2, -1), b)));
}

TEST(GemmLtPlan, TheCacheKeyTellsApartWhatChangesTheAlgorithm) {
  alignas(16) static uint16_t buf[4096];
  const Gemm g = linear_gemm(64, 96, 32, buf, buf + 1024, buf + 2048);
  const LtPlan p = lt_plan(kCPU, kBFloat16, g, LtEpilogue::Bias, buf + 3072);
  EXPECT_EQ(p, lt_plan(kCPU, kBFloat16, g, LtEpilogue::Bias, buf + 3072));
  EXPECT_EQ(LtPlanHash()(p), LtPlanHash()(lt_plan(kCPU, kBFloat16, g, LtEpilogue::Bias, buf + 3072)));
  EXPECT_EQ(p.align, 16);
  // Another bias 2 bytes along: same shape, only 2-byte alignment, another algorithm.
  const LtPlan odd = lt_plan(kCPU, kBFloat16, g, LtEpilogue::Bias, buf + 3073);
  EXPECT_EQ(odd.align, 2);
  EXPECT_FALSE(odd == p);
  EXPECT_FALSE(lt_plan(kCPU, kBFloat16, g, LtEpilogue::None, nullptr) == p);
  // linear_gelu's plan: another epilogue on the same shape; its aux's alignment counts too.
  const LtPlan gelu = lt_plan(kCPU, kBFloat16, g, LtEpilogue::GeluAuxBias, buf + 3072, buf + 3200);
  EXPECT_FALSE(gelu == p);
  EXPECT_EQ(gelu.align, 16);
  EXPECT_EQ(lt_plan(kCPU, kBFloat16, g, LtEpilogue::GeluAuxBias, buf + 3072, buf + 3204).align, 8);
  EXPECT_FALSE(lt_plan(kCPU, kFloat16, g, LtEpilogue::Bias, buf + 3072) == p);
  EXPECT_FALSE(lt_plan(Device(DeviceType::CUDA, 1), kBFloat16, g, LtEpilogue::Bias, buf + 3072) == p);
  EXPECT_FALSE(lt_plan(kCPU, kBFloat16, linear_gemm(64, 96, 48, buf, buf + 1024, buf + 2048), LtEpilogue::Bias,
                       buf + 3072) == p);
  EXPECT_EQ(common_alignment({32, 48, 0}), 16);
  EXPECT_EQ(common_alignment({32, 6}), 2);
  // An epilogue on a batched GEMM is refused (loom asks for none).
  Gemm batched = g;
  batched.batch = 2;
  EXPECT_THROW(lt_plan(kCPU, kBFloat16, batched, LtEpilogue::Bias, buf), Error);
}

TEST(GemmLtPlan, OnlyBf16AndFp16TakeThePathAndOnlyUnderFastKernels) {
  set_kernel_choice(KernelChoice::Fast);
  EXPECT_TRUE(use_lt(kBFloat16));
  EXPECT_TRUE(use_lt(kFloat16));
  EXPECT_FALSE(use_lt(kFloat32));
  EXPECT_FALSE(use_lt(kFloat64));
  set_kernel_choice(KernelChoice::Reference);
  EXPECT_FALSE(use_lt(kBFloat16));
  EXPECT_FALSE(use_lt(kFloat16));
  reset_kernel_choice();
  EXPECT_EQ(forward_epilogue(true), LtEpilogue::Bias);
  EXPECT_EQ(forward_epilogue(false), LtEpilogue::None);
  EXPECT_EQ(weight_grad_epilogue(true), LtEpilogue::BGradB);
  EXPECT_EQ(weight_grad_epilogue(false), LtEpilogue::None);
  EXPECT_EQ(gelu_epilogue(true), LtEpilogue::GeluAuxBias);
  EXPECT_EQ(gelu_epilogue(false), LtEpilogue::GeluAux);
}
