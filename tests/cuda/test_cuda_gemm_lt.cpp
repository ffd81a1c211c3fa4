// The cuBLASLt GEMM path (tensor/cuda/fast/gemm_lt.h, LOOM_CUDA_KERNELS=fast,
// bf16/fp16) against the CPU and against the reference path (gemm.cpp: widen,
// sgemm, round) on the same inputs, at GPT's shapes (tokens x C -> 3C, 4C, C;
// GPT-2 124M's 768 -> 2304 and its 50257-token head, an odd leading dimension)
// and odd ones; matmul's batched, transposed and broadcast operands; the same
// bits on a second run; and the launches it saves, counted.
// Tolerances: both sides round an fp32 sum once to bf16/fp16, in other orders,
// so they differ by at most one unit of the last place: 2^-7 relative for bf16
// (rtol 1e-2), 2^-10 for fp16 (2e-3), plus 1e-4 absolute for the fp32 sums'
// order near zero. The bias gradient: fp32 sum (cuBLASLt) vs double (the
// reference), rounded once: the same bound.
#include <cmath>
#include <functional>

#include "cuda_test.h"
#include "tensor/cuda/fast/gemm_lt.h"
#include "tensor/cuda/launch_count.h"

using namespace loom;
using cuda_test::expect_close;
using cuda_test::fast;
using cuda_test::random;
using cuda_test::reference;
using cuda_test::rtol_for;

namespace {

constexpr double kAtol = 1e-4;

// The Lt result vs the CPU, vs the reference GPU path, and vs itself run again (same bits).
void expect_lt_right(const std::function<Tensor()>& on_gpu, const Tensor& on_cpu, DType dt) {
  Tensor lt = fast(on_gpu), again = fast(on_gpu), ref = reference(on_gpu);
  expect_close(lt, on_cpu, rtol_for(dt), kAtol);
  expect_close(lt, ops::to(ref, kCPU), rtol_for(dt), kAtol);
  EXPECT_EQ(lt.to_vector<double>(), again.to_vector<double>()) << "two runs of the same input differ";
}

struct Shape3 {
  int64_t M, K, N;
};

}  // namespace

using CudaGemmLt = cuda_test::CudaTest;

TEST_F(CudaGemmLt, LinearAndItsBackwardAtGptShapes) {
  const Shape3 shapes[] = {{256, 128, 384}, {256, 128, 128}, {256, 128, 512}, {256, 512, 128},  // toy GPT, C = 128
                           {1024, 768, 2304}, {64, 768, 50257},                                   // GPT-2 124M
                           {5, 7, 3}, {33, 17, 65}, {1, 9, 1}};                                   // odd
  for (DType dt : {kBFloat16, kFloat16}) {
    for (const Shape3& s : shapes) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " M " << s.M << " K " << s.K << " N " << s.N);
      Tensor x = random({s.M, s.K}, 1, dt), w = ops::mul(random({s.N, s.K}, 2, dt), 0.1);
      Tensor b = random({s.N}, 3, dt), g = random({s.M, s.N}, 4, dt);
      Tensor gx = ops::to(x, gpu), gw = ops::to(w, gpu), gb = ops::to(b, gpu), gg = ops::to(g, gpu);
      expect_lt_right([&] { return ops::linear(gx, gw, gb); }, ops::linear(x, w, b), dt);
      expect_lt_right([&] { return ops::linear(gx, gw, Tensor()); }, ops::linear(x, w, Tensor()), dt);
      const ops::LinearGrads want = ops::linear_backward(g, x, w, true, true, true);
      auto grads = [&] { return ops::linear_backward(gg, gx, gw, true, true, true); };
      expect_lt_right([&] { return grads().dx; }, want.dx, dt);
      expect_lt_right([&] { return grads().dw; }, want.dw, dt);
      expect_lt_right([&] { return grads().db; }, want.db, dt);
      // The weight's gradient alone (zero-bubble's W pass without a bias) and db alone.
      expect_lt_right([&] { return ops::linear_backward(gg, gx, gw, false, true, false).dw; }, want.dw, dt);
      expect_lt_right([&] { return ops::linear_backward(gg, gx, gw, false, false, true).db; }, want.db, dt);
    }
  }
}

TEST_F(CudaGemmLt, LinearOnBatchedAndEmptyInputs) {
  const DType dt = kBFloat16;
  Tensor x = random({2, 5, 8}, 5, dt), w = random({6, 8}, 6, dt), b = random({6}, 7, dt);
  Tensor gx = ops::to(x, gpu), gw = ops::to(w, gpu), gb = ops::to(b, gpu);
  expect_lt_right([&] { return ops::linear(gx, gw, gb); }, ops::linear(x, w, b), dt);
  // A non-contiguous input (a transposed view on the GPU) is made contiguous first.
  Tensor xt = random({8, 5}, 8, dt), gxt = ops::transpose(ops::to(xt, gpu), 0, 1);
  expect_lt_right([&] { return ops::linear(gxt, gw, gb); }, ops::linear(ops::transpose(xt, 0, 1), w, b), dt);
  Tensor x0 = random({0, 8}, 9, dt), k0 = random({4, 0}, 10, dt), w0 = random({6, 0}, 11, dt);
  expect_lt_right([&] { return ops::linear(ops::to(x0, gpu), gw, gb); }, ops::linear(x0, w, b), dt);  // M = 0
  // K = 0: every row the bias.
  expect_lt_right([&] { return ops::linear(ops::to(k0, gpu), ops::to(w0, gpu), gb); }, ops::linear(k0, w0, b), dt);
}

TEST_F(CudaGemmLt, MatmulBatchedTransposedAndBroadcast) {
  for (DType dt : {kBFloat16, kFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    auto check = [&](const Tensor& a, const Tensor& b) {
      Tensor ga = ops::to(a, gpu), gb = ops::to(b, gpu);
      expect_lt_right([&] { return ops::matmul(ga, gb); }, ops::matmul(a, b), dt);
    };
    // Attention's scores and output at the toy GPT's shape: [B, H, T, hd] @ [B, H, hd, T], then @ [B, H, T, hd].
    Tensor q = random({2, 4, 64, 32}, 1, dt), k = random({2, 4, 64, 32}, 2, dt);
    check(q, ops::transpose(k, -2, -1));
    check(random({2, 4, 64, 64}, 3, dt), random({2, 4, 64, 32}, 4, dt));
    check(random({2, 1, 7, 5}, 5, dt), random({3, 5, 3}, 6, dt));                           // broadcast batch
    check(random({4, 7, 5}, 7, dt), random({5, 3}, 8, dt));                                 // folded into one GEMM
    check(ops::permute(random({7, 4, 5}, 9, dt), {1, 0, 2}), random({4, 5, 3}, 10, dt));  // batch stride != M*K
    check(random({3, 0}, 11, dt), random({0, 4}, 12, dt));                                  // K = 0: zeros
  }
}

// The launches each path makes for a bf16 linear with a bias (tensor/cuda/launch_count.h):
// reference forward: x, w, b widened (3), b copied into the rows (1), the GEMM (1), the result rounded (1) = 6;
// reference dx: g, w widened (2), GEMM (1), rounded (1) = 4; dW + db: g, x widened (2), GEMM (1),
// rounded (1), the column sum (1) and its rounding (1) = 6. cuBLASLt: one call each, the bias and db in epilogues.
TEST_F(CudaGemmLt, OneLaunchPerProductWithTheBiasAndItsGradientFolded) {
  const DType dt = kBFloat16;
  Tensor gx = ops::to(random({256, 128}, 1, dt), gpu), gw = ops::to(random({384, 128}, 2, dt), gpu);
  Tensor gb = ops::to(random({384}, 3, dt), gpu), gg = ops::to(random({256, 384}, 4, dt), gpu);
  auto count = [&](const std::function<void()>& f) {
    cuda::synchronize(gpu);
    cuda::LaunchWindow window;
    f();
    return window.count();
  };
  auto fwd = [&] { ops::linear(gx, gw, gb); };
  auto bwd_x = [&] { ops::linear_backward(gg, gx, gw, true, false, false); };
  auto bwd_w = [&] { ops::linear_backward(gg, gx, gw, false, true, true); };
  EXPECT_EQ(reference([&] { return count(fwd); }), 6);
  EXPECT_EQ(reference([&] { return count(bwd_x); }), 4);
  EXPECT_EQ(reference([&] { return count(bwd_w); }), 6);
  const cuda::fast::LtCounts before = cuda::fast::lt_counts();
  EXPECT_EQ(fast([&] { return count(fwd); }), 1);
  EXPECT_EQ(fast([&] { return count(bwd_x); }), 1);
  EXPECT_EQ(fast([&] { return count(bwd_w); }), 1);
  const cuda::fast::LtCounts after = cuda::fast::lt_counts();
  EXPECT_EQ(after.lt - before.lt, 3) << "all three on cuBLASLt";
  EXPECT_EQ(after.fallback, before.fallback) << "no GEMM of these aligned shapes fell back to cuBLAS";
}
