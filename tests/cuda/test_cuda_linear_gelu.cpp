// linear_gelu on the GPU (the MLP's c_fc and its GELU as one op): under
// LOOM_CUDA_KERNELS=fast, bf16/fp16, one cuBLASLt call with
// CUBLASLT_EPILOGUE_GELU_AUX_BIAS (tensor/cuda/fast/gemm_lt.h), against the
// reference CUDA path (the two ops: linear, then the gelu kernel) and the CPU
// (the two ops), forward (y, and the pre-activation h it keeps) and backward
// through autograd (dx, dW, db: gelu_backward, then linear's backward); the
// same bits on a second run; the launches the fusion saves.
// Tolerances (gemm_lt.h's numerics), u = 2^-8 (bf16) or 2^-11 (fp16):
//   h    linear's: one unit of the last place, rtol 1e-2 bf16 / 2e-3 fp16, atol 1e-4;
//   y    GELU of the unrounded fp32 sum vs GELU of h rounded: |dy| <= rtol |y|
//        + 1.13 u |h|, taken as rtol |y| + 2 u |h| + atol (the rest: cuBLASLt's
//        tanh, undocumented, and the accumulation order);
//   grads gelu_backward reads an h that differs by a unit of its last place, then
//        a GEMM sums over tokens or features in another order: max |diff| <= 4 u
//        max |reference| + atol, relative to the tensor's largest element (a
//        per-element bound fails on sums that cancel).
// Derived, not measured: this test has not run on a GPU yet.
#include <algorithm>
#include <cmath>
#include <functional>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "cuda_test.h"
#include "tensor/cuda/fast/gemm_lt.h"
#include "tensor/cuda/launch_count.h"

using namespace loom;
using cuda_test::fast;
using cuda_test::random;
using cuda_test::reference;
using cuda_test::rtol_for;

namespace {

constexpr double kAtol = 1e-4;

double unit(DType dt) { return dt == kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }

// Everything one run produces, copied to the CPU.
struct Outputs {
  Tensor h, y, dx, dw, db;
};

// Forward and backward of linear_gelu on dev (inputs given on the CPU).
Outputs forward_backward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& dy, const Device& dev) {
  auto on = [&](const Tensor& t) { return t.defined() ? ops::clone(ops::to(t, dev)) : Tensor(); };
  auto cpu = [](const Tensor& t) { return t.defined() ? ops::to(t, kCPU) : Tensor(); };
  Tensor xd = on(x), wd = on(w), bd = on(b);
  for (const Tensor* t : {&xd, &wd, &bd})
    if (t->defined()) autograd::set_requires_grad(*t);
  const Tensor h = ops::linear_gelu(xd, wd, bd).h;  // what the op keeps for gelu's backward
  Tensor y = autograd::linear_gelu(xd, wd, bd);
  autograd::backward({y}, {on(dy)});
  const Tensor db = b.defined() ? cpu(autograd::grad(bd)) : Tensor();
  return {cpu(h), cpu(y), cpu(autograd::grad(xd)), cpu(autograd::grad(wd)), db};
}

// got vs want elementwise: |diff| <= rtol |want| + slack_i + atol (slack: y's 2 u |h|).
void expect_within(const Tensor& got, const Tensor& want, double rtol, const std::vector<double>& slack,
                   const char* what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<double> g = got.to_vector<double>(), c = want.to_vector<double>();
  int bad = 0;
  for (size_t i = 0; i < c.size() && bad < 5; ++i) {
    const double tol = rtol * std::fabs(c[i]) + (slack.empty() ? 0.0 : slack[i]) + kAtol;
    if (std::fabs(g[i] - c[i]) <= tol) continue;
    ADD_FAILURE() << what << ", element " << i << ": " << g[i] << " vs " << c[i] << " (tolerance " << tol << ")";
    ++bad;
  }
}

// max |got - want| <= tol max |want| + atol: a gradient, summed in another order.
void expect_scaled(const Tensor& got, const Tensor& want, double tol, const char* what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<double> g = got.to_vector<double>(), c = want.to_vector<double>();
  double worst = 0, scale = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    worst = std::max(worst, std::fabs(g[i] - c[i]));
    scale = std::max(scale, std::fabs(c[i]));
  }
  EXPECT_LE(worst, tol * scale + kAtol) << what << ": worst difference " << worst << ", largest element " << scale;
}

// The fast run against another (the reference path or the CPU), by the bounds above.
void expect_fast_right(const Outputs& f, const Outputs& want, DType dt) {
  const double u = unit(dt);
  std::vector<double> slack = want.h.to_vector<double>();
  for (double& v : slack) v = 2 * u * std::fabs(v);
  expect_within(f.h, want.h, rtol_for(dt), {}, "h");
  expect_within(f.y, want.y, rtol_for(dt), slack, "y");
  expect_scaled(f.dx, want.dx, 4 * u, "dx");
  expect_scaled(f.dw, want.dw, 4 * u, "dW");
  if (want.db.defined()) expect_scaled(f.db, want.db, 4 * u, "db");
}

bool same_values(const Tensor& a, const Tensor& b) {
  return !a.defined() ? !b.defined() : a.to_vector<double>() == b.to_vector<double>();
}

struct Shape3 {
  int64_t M, K, N;
};

}  // namespace

using CudaLinearGelu = cuda_test::CudaTest;

TEST_F(CudaLinearGelu, FastAgainstTheReferenceAndTheCpuForwardAndBackward) {
  const Shape3 shapes[] = {{256, 128, 512},                  // the toy GPT's c_fc (C = 128)
                           {1024, 768, 3072},                // GPT-2 124M's, one sequence
                           {33, 17, 64}, {1, 9, 8},          // odd tokens and inputs: the fused call
                           {48, 16, 65}, {5, 7, 3}};         // N % 8 != 0: the two ops on the fast path
  for (DType dt : {kBFloat16, kFloat16}) {
    for (const Shape3& s : shapes) {
      for (bool with_bias : {true, false}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " M " << s.M << " K " << s.K << " N " << s.N
                                          << (with_bias ? " bias" : " no bias"));
        Tensor x = random({s.M, s.K}, 1, dt), w = ops::mul(random({s.N, s.K}, 2, dt), 1 / std::sqrt(double(s.K)));
        Tensor b = with_bias ? random({s.N}, 3, dt) : Tensor(), dy = random({s.M, s.N}, 4, dt);
        const Outputs f = fast([&] { return forward_backward(x, w, b, dy, gpu); });
        const Outputs again = fast([&] { return forward_backward(x, w, b, dy, gpu); });
        expect_fast_right(f, reference([&] { return forward_backward(x, w, b, dy, gpu); }), dt);
        expect_fast_right(f, forward_backward(x, w, b, dy, kCPU), dt);
        EXPECT_TRUE(same_values(f.h, again.h) && same_values(f.y, again.y) && same_values(f.dx, again.dx) &&
                    same_values(f.dw, again.dw) && same_values(f.db, again.db))
            << "two runs of the same input differ";
      }
    }
  }
}

// A bf16 linear + GELU with a bias, forward (tensor/cuda/launch_count.h): the
// reference's linear makes 6 launches (x, w, b widened, b copied into the
// rows, the GEMM, the result rounded) and its gelu 1; the fast path 1, the
// cuBLASLt call, on cuBLASLt (not its cuBLAS fallback). Before the fusion the
// fast path made 2: the BIAS call and the gelu kernel.
TEST_F(CudaLinearGelu, OneLaunchForTheLinearItsBiasAndItsGelu) {
  const DType dt = kBFloat16;
  Tensor gx = ops::to(random({256, 128}, 1, dt), gpu), gw = ops::to(random({512, 128}, 2, dt), gpu);
  Tensor gb = ops::to(random({512}, 3, dt), gpu);
  auto count = [&] {
    cuda::synchronize(gpu);
    cuda::LaunchWindow window;
    ops::linear_gelu(gx, gw, gb);
    return window.count();
  };
  EXPECT_EQ(reference(count), 7);
  const cuda::fast::LtCounts before = cuda::fast::lt_counts();
  EXPECT_EQ(fast(count), 1);
  const cuda::fast::LtCounts after = cuda::fast::lt_counts();
  EXPECT_EQ(after.lt - before.lt, 1) << "the GELU_AUX_BIAS call ran on cuBLASLt";
  EXPECT_EQ(after.fallback, before.fallback) << "no algorithm missing for this aligned shape";
}
