// The native bf16 GEMM (tensor/cpu/gemm_bf16.h: oneDNN's bf16 matmul, fp32
// accumulation) against references that do not use it: a double-precision
// product written here, and loom's own fp32 path (operands widened to fp32,
// sgemm, rounded back; ops::set_bf16_gemm("fp32")).
//
// The two paths multiply the same numbers (bf16 widens to fp32 exactly) and
// differ only in the order of the fp32 sums: results agree to fp32 rounding of
// a K-term dot product, and after rounding to bf16 to one bf16 step. A wrong
// transpose, leading dimension or split would be off by O(1).
//
// On a CPU without AVX512_BF16 or AMX (or a build without oneDNN) the native
// path does not exist and these tests skip, except the switch's own test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "optim/activation_memory.h"
#include "tensor/cpu/gemm_bf16.h"
#include "tensor/error.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

using namespace loom;

namespace {

#define SKIP_WITHOUT_BF16_HARDWARE()                                                                   \
  if (!cpu::bf16_gemm_hardware())                                                                      \
  GTEST_SKIP() << "no AVX512_BF16 or AMX on this CPU (or loom built without oneDNN): bf16 products " \
                  "take the fp32 path, which test_tensor_ops covers"

// Sets the bf16 GEMM mode and the thread count for one test; restores both.
class Setting {
 public:
  Setting(const std::string& mode, int threads) : mode_(ops::bf16_gemm()), threads_(ops::get_num_threads()) {
    ops::set_bf16_gemm(mode);
    ops::set_num_threads(threads);
  }
  ~Setting() {
    ops::set_bf16_gemm(mode_);
    ops::set_num_threads(threads_);
  }
  void set(const std::string& mode, int threads) {
    ops::set_bf16_gemm(mode);
    ops::set_num_threads(threads);
  }

 private:
  std::string mode_;
  int threads_;
};

// A stored matrix [rows, cols] with row stride ld >= cols; the padding holds
// NaN, so a kernel that reads past a row shows it.
struct Stored {
  int64_t rows, cols, ld;
  std::vector<bfloat16> data;
  float at(int64_t r, int64_t c) const { return bf16_to_float(data[size_t(r * ld + c)]); }
};

Stored random_stored(int64_t rows, int64_t cols, int64_t ld, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  Stored s{rows, cols, ld, std::vector<bfloat16>(size_t(std::max<int64_t>(rows * ld, 1)), float_to_bf16(NAN))};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) s.data[size_t(r * ld + c)] = float_to_bf16(normal(rng));
  return s;
}

// Asserts that two bf16 tensors of the same shape are elementwise at most one
// bf16 step apart (2^-7 of the value's power of two: bf16 keeps 8 significant
// bits), or 1e-5 of the largest value where a sum cancelled to near zero.
void expect_within_one_bf16_step(const Tensor& got, const Tensor& want, const char* what) {
  ASSERT_EQ(got.dtype(), kBFloat16) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  std::vector<float> g = got.to_vector<float>(), w = want.to_vector<float>();
  float scale = 0;
  for (float v : w) scale = std::max(scale, std::fabs(v));
  int64_t differ = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const float step = std::ldexp(1.0f, std::ilogb(std::max(std::fabs(g[i]), std::fabs(w[i])) + 1e-30f) - 7);
    ASSERT_NEAR(g[i], w[i], step + 1e-5f * scale) << what << ", element " << i;
    differ += g[i] != w[i];
  }
  // The fp32 sums differ in their last bits, which moves a bf16 rounding only
  // when the sum lies within ~2^-16 of a rounding boundary: a few in a thousand.
  EXPECT_LE(differ, int64_t(w.size() / 100) + 1) << what << ": " << differ << " of " << w.size() << " differ";
}

Tensor bf16_randn(const Shape& shape, Generator& g) { return ops::to(randn(shape, g), kBFloat16); }

}  // namespace

// The kernel itself, on every transpose, shapes that fit no block size
// (1, 7, 13, 65, 300) and padded leading dims, one product and the split,
// beta 0 and 1, C fp32 and bf16, against the double product of the same bf16
// numbers. The bound is fp32 rounding of a K-term sum, 1e-5 of
// sum_k |a_ik b_kj|, plus for a bf16 C one bf16 step of the result.
TEST(Bf16Gemm, KernelMatchesTheDoubleProductOnOddShapesAndEveryTranspose) {
  SKIP_WITHOUT_BF16_HARDWARE();
  Setting setting("bf16", 2);
  struct Shape3 { int64_t M, K, N; };
  std::mt19937 rng(5);
  for (Shape3 s : {Shape3{1, 1, 1}, {7, 13, 5}, {33, 65, 17}, {64, 32, 64}, {17, 1, 9}, {1, 40, 1}, {130, 300, 70},
                   {40, 96, 257}})
    for (int t = 0; t < 4; ++t)
      for (float beta : {0.0f, 1.0f}) {
        const bool ta = t >= 2, tb = t % 2 == 1;
        const int64_t M = s.M, K = s.K, N = s.N, ldc = N + 2;
        // A [M, K] is stored [K, M] when transposed, B [K, N] stored [N, K]; rows padded by 3.
        Stored a = ta ? random_stored(K, M, M + 3, rng) : random_stored(M, K, K + 3, rng);
        Stored b = tb ? random_stored(N, K, K + 3, rng) : random_stored(K, N, N + 3, rng);
        auto A = [&](int64_t i, int64_t k) { return ta ? a.at(k, i) : a.at(i, k); };
        auto B = [&](int64_t k, int64_t j) { return tb ? b.at(j, k) : b.at(k, j); };
        // C's start (the bias when beta = 1), bf16 numbers; padding columns -7.
        std::vector<float> c0(size_t(M * ldc));
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < ldc; ++j)
            c0[size_t(i * ldc + j)] = j < N ? bf16_to_float(float_to_bf16(float(i - j) / 8)) : -7.0f;
        for (int run = 0; run < 4; ++run) {
          const bool split = run % 2 == 1, bf16_c = run >= 2;
          std::vector<float> c = c0;
          if (bf16_c) {
            std::vector<bfloat16> cb(c0.size());
            for (size_t i = 0; i < c0.size(); ++i) cb[i] = float_to_bf16(c0[i]);
            if (split) cpu::gemm_bf16(ta, tb, M, N, K, a.data.data(), a.ld, b.data.data(), b.ld, beta, cb.data(), ldc);
            else cpu::gemm_bf16_serial(ta, tb, M, N, K, a.data.data(), a.ld, b.data.data(), b.ld, beta, cb.data(), ldc);
            for (size_t i = 0; i < c0.size(); ++i) c[i] = bf16_to_float(cb[i]);
          } else {
            if (split) cpu::gemm_bf16(ta, tb, M, N, K, a.data.data(), a.ld, b.data.data(), b.ld, beta, c.data(), ldc);
            else cpu::gemm_bf16_serial(ta, tb, M, N, K, a.data.data(), a.ld, b.data.data(), b.ld, beta, c.data(), ldc);
          }
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < ldc; ++j) {
              const float got = c[size_t(i * ldc + j)];
              if (j >= N) {
                ASSERT_EQ(got, -7.0f) << "wrote past row " << i << " of C";
                continue;
              }
              double want = beta * double(c0[size_t(i * ldc + j)]), bound = 0;
              for (int64_t k = 0; k < K; ++k) {
                want += double(A(i, k)) * double(B(k, j));
                bound += std::fabs(double(A(i, k)) * double(B(k, j)));
              }
              const double step = bf16_c ? std::ldexp(1.0, std::ilogb(std::fabs(want) + 1e-30) - 7) : 0.0;
              ASSERT_NEAR(got, want, 1e-5 * bound + 1e-6 + step)
                  << M << "x" << K << "x" << N << (ta ? " T" : " N") << (tb ? "T" : "N") << " beta " << beta
                  << (split ? " split" : " one call") << (bf16_c ? " bf16 C" : " fp32 C") << ", C[" << i << ", "
                  << j << "]";
            }
        }
      }
}

// Through ops::matmul: all four transposes (a transposed view is passed to
// the kernel as strides, not copied), a broadcast batch and a column slice
// (row stride larger than the row), native bf16 against loom's fp32 path.
TEST(Bf16Gemm, MatmulAgreesWithTheFp32PathToOneBf16Step) {
  SKIP_WITHOUT_BF16_HARDWARE();
  Setting setting("bf16", 2);
  Generator g(3);
  Tensor a = bf16_randn({130, 300}, g), b = bf16_randn({300, 70}, g);
  Tensor at = ops::transpose(bf16_randn({300, 130}, g), 0, 1), bt = ops::transpose(bf16_randn({70, 300}, g), 0, 1);
  Tensor q = bf16_randn({4, 3, 64, 32}, g), k = bf16_randn({4, 3, 64, 32}, g);  // attention: q kᵀ per (batch, head)
  Tensor x = bf16_randn({5, 33, 40}, g), w = bf16_randn({40, 9}, g);              // folded into one [165, 40] @ [40, 9]
  Tensor wide = bf16_randn({48, 100}, g), right = bf16_randn({3, 37, 48}, g);    // a [48, 37] column slice, batch broadcast
  auto run = [&] {
    return std::vector<Tensor>{ops::matmul(a, b),
                               ops::matmul(a, bt),
                               ops::matmul(at, b),
                               ops::matmul(at, bt),
                               ops::matmul(q, ops::transpose(k, 2, 3)),
                               ops::matmul(x, w),
                               ops::matmul(right, ops::narrow(wide, 1, 50, 37))};
  };
  ASSERT_EQ(ops::bf16_gemm(), "bf16");
  std::vector<Tensor> native = run();
  setting.set("fp32", 2);
  std::vector<Tensor> reference = run();
  for (size_t i = 0; i < native.size(); ++i)
    expect_within_one_bf16_step(native[i], reference[i], ("product " + std::to_string(i)).c_str());
}

// linear's forward (the bias is C's start, beta = 1) and all three gradients:
// dx = g @ w (NN), dW = gᵀ @ x (TN), db a column sum that reads the same
// numbers on both paths and so must be the same bits.
TEST(Bf16Gemm, LinearWithBiasAndItsGradientsAgreeWithTheFp32Path) {
  SKIP_WITHOUT_BF16_HARDWARE();
  Setting setting("bf16", 2);
  Generator g(9);
  Tensor x = bf16_randn({3, 37, 96}, g), w = bf16_randn({70, 96}, g), b = bf16_randn({70}, g);
  Tensor gy = bf16_randn({3, 37, 70}, g);
  auto run = [&] {
    ops::LinearGrads d = ops::linear_backward(gy, x, w, true, true, true);
    return std::vector<Tensor>{ops::linear(x, w, b), d.dx, d.dw, d.db};
  };
  std::vector<Tensor> native = run();
  setting.set("fp32", 2);
  std::vector<Tensor> reference = run();
  const char* names[] = {"y", "dx", "dw", "db"};
  for (size_t i = 0; i < 3; ++i) expect_within_one_bf16_step(native[i], reference[i], names[i]);
  EXPECT_EQ(native[3].to_vector<float>(), reference[3].to_vector<float>()) << "db";
}

// Determinism (gemm_bf16.h, "Threads"): the same thread count gives the same
// bits; a split product (rows when M >= N, columns otherwise) agrees with the
// unsplit one to fp32 rounding; a batch of products, each one call on one
// thread whatever the thread count, is bit-identical at 1 and 2 threads.
TEST(Bf16Gemm, SameThreadsSameBitsAndTheSplitAgreesToRounding) {
  SKIP_WITHOUT_BF16_HARDWARE();
  Setting setting("bf16", 2);
  struct Shape3 { int64_t M, K, N; };
  std::mt19937 rng(13);
  for (Shape3 s : {Shape3{256, 300, 300}, {64, 256, 512}}) {  // split by rows; by columns
    Stored a = random_stored(s.M, s.K, s.K, rng), b = random_stored(s.K, s.N, s.N, rng);
    auto product = [&](int threads) {
      ops::set_num_threads(threads);
      std::vector<float> c(size_t(s.M * s.N));
      cpu::gemm_bf16(false, false, s.M, s.N, s.K, a.data.data(), s.K, b.data.data(), s.N, 0.0f, c.data(), s.N);
      return c;
    };
    std::vector<float> two = product(2), again = product(2), one = product(1);
    EXPECT_EQ(0, std::memcmp(two.data(), again.data(), two.size() * sizeof(float))) << s.M << "x" << s.K << "x" << s.N;
    float scale = 0;
    for (float v : one) scale = std::max(scale, std::fabs(v));
    for (size_t i = 0; i < one.size(); ++i) ASSERT_NEAR(two[i], one[i], 1e-6f * scale) << "element " << i;
  }
  Generator g(17);
  Tensor q = bf16_randn({4, 3, 64, 32}, g), k = bf16_randn({4, 3, 64, 32}, g);
  setting.set("bf16", 1);
  std::vector<float> one = ops::matmul(q, ops::transpose(k, 2, 3)).to_vector<float>();
  setting.set("bf16", 2);
  EXPECT_EQ(one, ops::matmul(q, ops::transpose(k, 2, 3)).to_vector<float>());
}

// The switch: "fp32" always works and is what bf16_gemm() then reports;
// "bf16" only where the hardware has it; anything else is refused.
TEST(Bf16Gemm, TheSwitchSelectsThePathAndRefusesWhatIsNotThere) {
  Setting setting("fp32", ops::get_num_threads());
  EXPECT_EQ(ops::bf16_gemm(), "fp32");
  if (cpu::bf16_gemm_hardware()) {
    ops::set_bf16_gemm("bf16");
    EXPECT_EQ(ops::bf16_gemm(), "bf16");
  } else {
    EXPECT_THROW(ops::set_bf16_gemm("bf16"), Error);
    EXPECT_EQ(ops::bf16_gemm(), "fp32");
  }
  EXPECT_THROW(ops::set_bf16_gemm("fp16"), Error);
}

// What a memory prediction assumes for a run's device (train/diagnostics.cpp,
// --memory-report): the CPU reads bf16 operands natively where its switch says
// so; a GPU always widens them to fp32 (tensor/cuda/gemm.cpp), whatever the
// CPU's switch, so a GPU run's fp32 copies must be counted.
TEST(Bf16Gemm, OnlyTheCpuSwitchMakesBf16OperandsNative) {
  Setting setting("fp32", ops::get_num_threads());
  EXPECT_FALSE(optim::native_bf16_gemm(kCPU));
  EXPECT_FALSE(optim::native_bf16_gemm(Device("cuda:0")));
  if (!cpu::bf16_gemm_hardware()) return;  // the switch cannot say "bf16" here
  setting.set("bf16", ops::get_num_threads());
  EXPECT_TRUE(optim::native_bf16_gemm(kCPU));
  EXPECT_FALSE(optim::native_bf16_gemm(Device("cuda:0"))) << "the GPU follows the CPU's bf16 switch";
  EXPECT_FALSE(optim::native_bf16_gemm(Device("cuda:1")));
}
