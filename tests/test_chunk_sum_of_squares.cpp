// The grad norm's one-reduction order (tensor/kernels/chunk_sum_of_squares.h)
// on the CPU: the CPU run of both passes against the reference sum of squares
// (ops::sum_of_squares) over sizes around the chunk, its order checked by hand
// where doubles round, and the optim/ dispatch (optim/grad_multi_tensor.h)
// leaving CPU grads on the per-tensor ops with the reference's bits under
// LOOM_CUDA_KERNELS=fast. The kernels themselves against this model and the
// reference kernels: tests/cuda/test_cuda_grad_multi_tensor.cpp (a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "optim/clip_grad.h"
#include "optim/grad_multi_tensor.h"
#include "optim/grad_scaler.h"
#include "tensor/cuda/fast/grad_norm_multi_tensor.h"
#include "tensor/cuda/kernel_choice.h"
#include "tensor/generator.h"
#include "tensor/kernels/chunk_sum_of_squares.h"
#include "tensor/ops.h"

using namespace loom;

namespace {

// Sizes around the kernels' 4096-element chunk, and one of many chunks.
const std::vector<int64_t> kSizes = {0, 1, 7, 4095, 4096, 4097, 2 * 4096 + 3, 100003};

std::vector<Tensor> grads(double spread) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < kSizes.size(); ++i) {
    Generator gen(40 + i);
    out.push_back(ops::mul(randn({kSizes[i]}, gen), std::pow(spread, double(i % 3) - 1.0)));  // 1/spread .. spread
  }
  return out;
}

double model(const std::vector<Tensor>& g, int64_t chunk = cuda::kNormChunk, int lanes = cuda::kNormLanes) {
  std::vector<const float*> x;
  std::vector<int64_t> n;
  for (const Tensor& t : g) {
    x.push_back(t.numel() ? t.data<float>() : nullptr);
    n.push_back(t.numel());
  }
  return kernels::chunked_sum_of_squares(x, n, chunk, lanes);
}

// LOOM_CUDA_KERNELS=fast for the scope, the environment's choice after (also when an assertion ends a test).
struct FastKernels {
  FastKernels() { cuda::set_kernel_choice(cuda::KernelChoice::Fast); }
  ~FastKernels() { cuda::reset_kernel_choice(); }
};

}  // namespace

TEST(ChunkSumOfSquares, TheKernelsOrderGivesTheReferenceSum) {
  for (double spread : {1.0, 1e3}) {
    SCOPED_TRACE(spread);
    const std::vector<Tensor> g = grads(spread);
    const double ref = ops::sum_of_squares(g);
    // Another order of the same double adds of exact squares: float64 rounding apart (measured 4.9e-14
    // relative at most: the reference adds 100003 squares one after another).
    EXPECT_NEAR(model(g), ref, 1e-12 * ref);
    EXPECT_NEAR(model(g, 64, 8), ref, 1e-12 * ref);
    EXPECT_NEAR(model(g, 1, 1), ref, 1e-12 * ref);
    EXPECT_EQ(model(g), model(g));  // no state: the same bits twice
  }
  EXPECT_EQ(model({}), 0.0);
  EXPECT_EQ(model({zeros({0})}), 0.0);
}

TEST(ChunkSumOfSquares, AddsInTheDocumentedOrder) {
  // Values whose squares round when added (2^27 squared is 2^54: its ulp is 4), so the order shows:
  // one tensor of 6, chunks of 4, 2 lanes.
  //   chunk 0 = x0..x3: lane 0 adds x0^2 then x2^2, lane 1 x1^2 then x3^2; the tree: lane 0 + lane 1.
  //   chunk 1 = x4, x5: lane 0 x4^2, lane 1 x5^2.   pass 2: lane 0 gets partial 0, lane 1 partial 1.
  const std::vector<float> x = {134217728.0f, 1.0f, 1.5f, 1.0f, 1.0f, 1.25f};
  std::vector<double> sq;
  for (float v : x) sq.push_back(double(v) * double(v));
  const double chunk0 = (sq[0] + sq[2]) + (sq[1] + sq[3]);
  const double chunk1 = sq[4] + sq[5];
  const double want = chunk0 + chunk1;
  EXPECT_EQ(kernels::chunked_sum_of_squares({x.data()}, {6}, 4, 2), want);
  // Other orders give other numbers here, so the check above can fail: element order, or contiguous lanes.
  double in_order = 0;
  for (double v : sq) in_order += v;
  EXPECT_NE(in_order, want);
  EXPECT_NE(((sq[0] + sq[1]) + (sq[2] + sq[3])) + chunk1, want);
  EXPECT_THROW(kernels::chunked_sum_of_squares({x.data()}, {6}, 4, 3), Error);  // lanes: a power of two
}

TEST(ChunkSumOfSquares, CpuGradsKeepThePerTensorOpsUnderFastKernels) {
  std::vector<Tensor> a = grads(1e3), b = grads(1e3);  // a: through optim/ under fast kernels; b: the ops
  a.push_back(Tensor());  // an undefined grad: skipped
  FastKernels fast;
  const optim::OneLaunchSplit s = optim::split_for_one_launch(a);
  EXPECT_TRUE(s.together.empty());  // CPU grads never go to the one launch
  EXPECT_EQ(s.rest.size(), kSizes.size());
  EXPECT_EQ(optim::grads_sum_of_squares(a), ops::sum_of_squares(b));
  EXPECT_FALSE(optim::unscale_(a, 1.0 / 1024));
  EXPECT_FALSE(ops::unscale_(b, 1.0 / 1024));
  optim::scale_grads_to_norm(a, 1.0, 4.0);
  for (size_t i = 0; i < b.size(); ++i) {
    ops::mul_(b[i], 1.0 / (4.0 + 1e-6));
    EXPECT_EQ(a[i].to_vector<float>(), b[i].to_vector<float>()) << i;  // bit for bit
  }
  a[3].data<float>()[5] = INFINITY;
  EXPECT_TRUE(optim::unscale_(a, 0.5));
}
