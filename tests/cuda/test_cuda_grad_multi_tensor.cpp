// The grad scaler's and clipping's one-launch passes (tensor/cuda/fast/
// unscale_multi_tensor.h, grad_norm_multi_tensor.h) against the per-tensor
// reference (optim.cu's unscale_kernel, ops::mul_, ops::sum_of_squares):
// unscale and the clipping scale bit for bit, found_inf for an inf or a nan in
// any chunk of any tensor, the sum of squares bit for bit against the CPU run
// of the kernels' order (tensor/kernels/chunk_sum_of_squares.h) and to float64
// rounding against the reference, twice for the bits; then the optimizer's
// tail through optim/ (unscale_, global_grad_norm, scale_grads_to_norm), both
// ways, with each way's launch count predicted. The order itself is tested on
// the CPU by tests/test_chunk_sum_of_squares.cpp.
#include <cmath>

#include "cuda_test.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "tensor/cuda/fast/grad_norm_multi_tensor.h"
#include "tensor/cuda/fast/unscale_multi_tensor.h"
#include "tensor/cuda/kernel_choice.h"
#include "tensor/cuda/launch_count.h"
#include "tensor/kernels/chunk_sum_of_squares.h"

using namespace loom;
using cuda_test::random;

using CudaGradMultiTensor = cuda_test::CudaTest;

namespace {

// 4096 is the kernels' chunk: one below, at, one above, two chunks and a bit; and a 0-element grad.
const std::vector<int64_t> kSizes = {0, 1, 7, 4095, 4096, 4097, 2 * 4096 + 3};
constexpr int64_t kNonEmpty = 6;

std::vector<Tensor> grads(const Device& d, uint64_t seed, double scale = 1000.0) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < kSizes.size(); ++i) out.push_back(ops::to(ops::mul(random({kSizes[i]}, seed + i), scale), d));
  return out;
}

std::vector<Tensor> on_cpu(const std::vector<Tensor>& g) {
  std::vector<Tensor> out;
  for (const Tensor& t : g) out.push_back(ops::to(t, kCPU));
  return out;
}

void expect_same_bits(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].to_vector<float>(), b[i].to_vector<float>()) << "grad " << i;
}

double cpu_model(const std::vector<Tensor>& gpu_grads) {
  const std::vector<Tensor> c = on_cpu(gpu_grads);
  std::vector<const float*> x;
  std::vector<int64_t> n;
  for (const Tensor& t : c) {
    x.push_back(t.numel() ? t.data<float>() : nullptr);
    n.push_back(t.numel());
  }
  return kernels::chunked_sum_of_squares(x, n, cuda::kNormChunk, cuda::kNormLanes);
}

}  // namespace

TEST_F(CudaGradMultiTensor, UnscaleGivesTheReferenceBitsAndFoundInf) {
  const double inv = 1.0 / 65536;
  std::vector<Tensor> ref = grads(gpu, 1), one = grads(gpu, 1);
  cuda::LaunchWindow per_tensor;
  EXPECT_FALSE(ops::unscale_(ref, inv));
  EXPECT_EQ(per_tensor.count(), kNonEmpty + 1);  // a memset of the flag, a kernel a non-empty grad
  cuda::LaunchWindow multi;
  EXPECT_FALSE(cuda::unscale_multi_tensor(one, inv));
  EXPECT_EQ(multi.count(), 1);  // the flag is zeroed in the uploaded table
  expect_same_bits(on_cpu(one), on_cpu(ref));
  // An inf or a nan in the first, a middle and the last chunk of a tensor: found, and the rest still unscaled.
  for (float bad : {INFINITY, -INFINITY, NAN})
    for (const auto& [t, i] : std::vector<std::pair<size_t, int64_t>>{{1, 0}, {5, 4096}, {6, 2 * 4096 + 2}}) {
      SCOPED_TRACE(std::to_string(bad) + " in grad " + std::to_string(t) + " element " + std::to_string(i));
      std::vector<Tensor> a = grads(gpu, 9), b = grads(gpu, 9);
      ops::fill_(ops::narrow(a[t], 0, i, 1), bad);
      ops::fill_(ops::narrow(b[t], 0, i, 1), bad);
      EXPECT_TRUE(ops::unscale_(a, inv));
      EXPECT_TRUE(cuda::unscale_multi_tensor(b, inv));
      EXPECT_EQ(ops::to(b[2], kCPU).to_vector<float>(), ops::to(a[2], kCPU).to_vector<float>());
    }
  EXPECT_FALSE(cuda::unscale_multi_tensor({}, inv));
  EXPECT_THROW(cuda::unscale_multi_tensor({ops::to(one[1], kBFloat16)}, inv), Error);  // fp32 main grads only
}

TEST_F(CudaGradMultiTensor, ScaleGivesMulsBits) {
  std::vector<Tensor> ref = grads(gpu, 2), one = grads(gpu, 2);
  const double coef = 1.0 / (37.25 + 1e-6);
  for (const Tensor& g : ref) ops::mul_(g, coef);
  cuda::LaunchWindow multi;
  cuda::scale_multi_tensor(one, coef);
  EXPECT_EQ(multi.count(), 1);
  expect_same_bits(on_cpu(one), on_cpu(ref));
}

TEST_F(CudaGradMultiTensor, SumOfSquaresIsTheModelsBitsAndTheReferencesValue) {
  for (double scale : {1.0, 1e-3, 1e3}) {
    SCOPED_TRACE(scale);
    const std::vector<Tensor> g = grads(gpu, 3, scale);
    cuda::LaunchWindow multi;
    const double fast = cuda::sum_of_squares_multi_tensor(g);
    EXPECT_EQ(multi.count(), 2);  // the chunks' partial sums, then their sum
    EXPECT_EQ(fast, cuda::sum_of_squares_multi_tensor(g));  // deterministic: the same bits again
    EXPECT_EQ(fast, cpu_model(g));                          // the CPU's run of the kernels' order, bit for bit
    const double gpu_ref = ops::sum_of_squares(g), cpu_ref = ops::sum_of_squares(on_cpu(g));
    EXPECT_NEAR(fast, gpu_ref, 1e-12 * gpu_ref);  // float64 rounding: another order of the same adds
    EXPECT_NEAR(fast, cpu_ref, 1e-12 * cpu_ref);
  }
  EXPECT_EQ(cuda::sum_of_squares_multi_tensor({}), 0.0);
  EXPECT_EQ(cuda::sum_of_squares_multi_tensor({zeros({0}, kFloat32, gpu)}), 0.0);
}

// The optimizer's tail as MixedPrecisionOptimizer::unscale_and_clip runs it: unscale, the norm, the clipping
// scale. Launches for N non-empty fp32 grads: reference N + 1, 4N - 1 (a tensor: widen to float64, square,
// sum; add to the total but the first), N; fast 1, 2, 1.
TEST_F(CudaGradMultiTensor, TheOptimizersTailBothWays) {
  std::vector<Tensor> ref, fast;
  for (size_t i = 1; i < kSizes.size(); ++i) {  // non-empty: the reference's sum launches for a 0-element grad too
    ref.push_back(ops::to(random({kSizes[i]}, 50 + i), gpu));
    fast.push_back(ops::to(random({kSizes[i]}, 50 + i), gpu));
  }
  const int64_t n = int64_t(ref.size());
  double norm[2];
  int64_t launches[2];
  for (int k = 0; k < 2; ++k) {
    cuda::set_kernel_choice(k ? cuda::KernelChoice::Fast : cuda::KernelChoice::Reference);
    std::vector<Tensor>& g = k ? fast : ref;
    cuda::LaunchWindow w;
    EXPECT_FALSE(optim::unscale_(g, 1.0 / 1024));
    norm[k] = optim::global_grad_norm(g, nullptr);
    optim::scale_grads_to_norm(g, 0.05, norm[k]);  // randn / 1024 over ~2e4 elements: a norm of ~0.14, clipped
    launches[k] = w.count();
    cuda::reset_kernel_choice();
  }
  EXPECT_EQ(launches[0], (n + 1) + (4 * n - 1) + n);
  EXPECT_EQ(launches[1], 1 + 2 + 1);
  EXPECT_NEAR(norm[1], norm[0], 1e-12 * norm[0]);
  EXPECT_LT(0.05, norm[0]);
  // The clipping factors are float(0.05 / (norm + 1e-6)) of two norms a rounding apart: the same float, or one ulp.
  for (size_t i = 0; i < ref.size(); ++i) cuda_test::expect_close(fast[i], ops::to(ref[i], kCPU), 2.5e-7, 0);
}
