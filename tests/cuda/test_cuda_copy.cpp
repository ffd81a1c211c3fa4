// Copies: host <-> GPU in every dtype bit for bit, with dtype conversion as on
// the CPU, strided and broadcast sources, fill/zeros/full, contiguous(), and
// uploads through pinned buffers that do not wait for the GPU.
#include <chrono>
#include <vector>

#include "cuda_test.h"

using namespace loom;
using cuda_test::expect_close;
using cuda_test::random;

using CudaCopy = cuda_test::CudaTest;

TEST_F(CudaCopy, RoundTripKeepsEveryBitInEveryDtype) {
  for (DType dt : {kFloat64, kFloat32, kBFloat16, kFloat16, kInt32, kInt64}) {
    Tensor cpu = ops::to(ops::mul(random({3, 5}, 7, kFloat64), 1000.0), dt);
    Tensor back = ops::to(ops::to(cpu, gpu), kCPU);
    EXPECT_EQ(back.device(), kCPU);
    EXPECT_EQ(back.dtype(), dt);
    EXPECT_EQ(back.to_vector<double>(), cpu.to_vector<double>()) << dtype_name(dt);
  }
}

TEST_F(CudaCopy, DtypeConversionOnTheGpuMatchesTheCpu) {
  Tensor x = ops::mul(random({4, 33}, 3, kFloat64), 300.0);
  for (DType from : {kFloat64, kFloat32, kBFloat16, kFloat16, kInt32, kInt64})
    for (DType to : {kFloat64, kFloat32, kBFloat16, kFloat16, kInt32, kInt64}) {
      Tensor src = ops::to(x, from);
      Tensor on_gpu = ops::to(ops::to(src, gpu), to);  // converted by the copy kernel
      EXPECT_EQ(on_gpu.to_vector<double>(), ops::to(src, to).to_vector<double>())
          << dtype_name(from) << " -> " << dtype_name(to);
      EXPECT_EQ(ops::to(src, gpu, to).to_vector<double>(), ops::to(src, to).to_vector<double>());
    }
}

TEST_F(CudaCopy, StridedAndBroadcastSources) {
  Tensor x = random({4, 6, 5}, 11);
  Tensor xt = ops::permute(x, {2, 0, 1});  // non-contiguous
  expect_close(ops::to(xt, gpu), ops::contiguous(xt), 0, 0);      // strided host -> GPU
  Tensor g = ops::to(x, gpu);
  expect_close(ops::contiguous(ops::permute(g, {2, 0, 1})), ops::contiguous(xt), 0, 0);  // strided on the GPU
  expect_close(ops::contiguous(ops::narrow(g, 1, 2, 3)), ops::contiguous(ops::narrow(x, 1, 2, 3)), 0, 0);
  // A [6, 1] source broadcast into a strided [4, 6, 5] destination, from the host and on the GPU.
  Tensor col = random({6, 1}, 12);
  Tensor dst_gpu = zeros({5, 4, 6}, kFloat32, gpu), dst_cpu = zeros({5, 4, 6});
  ops::copy_(ops::permute(dst_gpu, {1, 2, 0}), col);
  ops::copy_(ops::permute(dst_cpu, {1, 2, 0}), col);
  expect_close(dst_gpu, dst_cpu, 0, 0);
  ops::copy_(ops::permute(dst_gpu, {1, 2, 0}), ops::to(ops::mul(col, 2.0), gpu));
  ops::copy_(ops::permute(dst_cpu, {1, 2, 0}), ops::mul(col, 2.0));
  expect_close(dst_gpu, dst_cpu, 0, 0);
  // GPU -> strided host destination.
  Tensor slice = ops::view(ops::contiguous(ops::narrow(x, 2, 0, 1)), {4, 6});
  Tensor host = zeros({6, 4});
  ops::copy_(ops::transpose(host, 0, 1), ops::to(slice, gpu));
  EXPECT_EQ(host.to_vector<float>(), ops::contiguous(ops::transpose(slice, 0, 1)).to_vector<float>());
}

TEST_F(CudaCopy, FillZerosAndFull) {
  for (DType dt : {kFloat64, kFloat32, kBFloat16, kFloat16, kInt32, kInt64}) {
    EXPECT_EQ(zeros({3, 2}, dt, gpu).to_vector<double>(), std::vector<double>(6, 0.0));
    EXPECT_EQ(full({3, 2}, 2.5, dt, gpu).to_vector<double>(), full({3, 2}, 2.5, dt).to_vector<double>());
    EXPECT_EQ(ones({5}, dt, gpu).to_vector<double>(), std::vector<double>(5, 1.0));
  }
  Tensor t = zeros({4, 4}, kFloat32, gpu), c = zeros({4, 4});
  ops::fill_(ops::transpose(ops::narrow(t, 0, 1, 2), 0, 1), 3.0);  // a strided fill
  ops::fill_(ops::transpose(ops::narrow(c, 0, 1, 2), 0, 1), 3.0);
  expect_close(t, c, 0, 0);
}

TEST_F(CudaCopy, ItemAndToVectorWaitForTheGpu) {
  Tensor big = ops::to(ones({1 << 20}), gpu);
  EXPECT_EQ(ops::sum(big).item<double>(), double(1 << 20));
  Tensor x = ops::to(tensor({1, 2, 3}), gpu);
  ops::mul_(x, 2.0);
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{2, 4, 6}));
}

TEST_F(CudaCopy, CatAndStackOnTheGpu) {
  Tensor a = random({2, 3}, 1), b = random({4, 3}, 2);
  expect_close(ops::cat({ops::to(a, gpu), ops::to(b, gpu)}, 0), ops::cat({a, b}, 0), 0, 0);
  expect_close(ops::stack({ops::to(a, gpu), ops::to(a, gpu)}, 1), ops::stack({a, a}, 1), 0, 0);
}

// Uploads stage through pinned buffers (tensor/cuda/pinned.h): the host does
// not wait for the kernels queued before them, the source may be overwritten
// as soon as to() returns, and a second round pins no new memory.
TEST_F(CudaCopy, UploadsQueueBehindKernelsWithoutAHostWaitAndReusePinnedBuffers) {
  using Clock = std::chrono::steady_clock;
  auto seconds_since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  Tensor a = ops::to(random({4096, 4096}, 1), gpu), busy = ops::matmul(a, a);
  cuda::synchronize(gpu);
  auto t0 = Clock::now();
  for (int i = 0; i < 20; ++i) busy = ops::matmul(busy, a);
  cuda::synchronize(gpu);
  const double gpu_seconds = seconds_since(t0);  // what 20 matmuls take

  auto upload_round = [&](int round) {
    std::vector<Tensor> up;
    Tensor src = empty({1024}, kInt64);
    for (int i = 0; i < 8; ++i) {
      for (int64_t j = 0; j < 1024; ++j) src.data<int64_t>()[j] = j * 10 + i + 100 * round;  // overwritten each time
      up.push_back(ops::to(src, gpu));
    }
    return up;
  };
  // Warm-up: the first round's cudaHostAlloc and cudaMalloc may synchronise
  // the host with whatever is queued, so they stay out of the timed round.
  upload_round(2);
  cuda::synchronize(gpu);
  for (int i = 0; i < 20; ++i) busy = ops::matmul(busy, a);  // queued; the uploads go behind them
  t0 = Clock::now();
  std::vector<Tensor> up = upload_round(0);
  const double host_seconds = seconds_since(t0);
  EXPECT_LT(host_seconds, gpu_seconds / 4) << "the uploads waited for the matmuls queued before them";
  // Each upload after the first asked whether the one before it had finished
  // (not yet: it is queued behind the matmuls). The runtime keeps that "not
  // ready" as the thread's last error unless it is cleared (cuda::query_event);
  // a kernel launched now would then fail its launch check.
  EXPECT_NO_THROW(ops::mul_(busy, 1.0)) << "a leftover cudaErrorNotReady from the pinned buffers' event queries";
  for (int i = 0; i < 8; ++i) {
    std::vector<int64_t> got = up[size_t(i)].to_vector<int64_t>();
    for (int64_t j = 0; j < 1024; ++j) ASSERT_EQ(got[size_t(j)], j * 10 + i) << "upload " << i << ", element " << j;
  }
  const int64_t pinned = cuda::allocator_stats(gpu).pinned_allocs;
  EXPECT_GT(pinned, 0);
  std::vector<Tensor> again = upload_round(1);
  EXPECT_EQ(again[7].to_vector<int64_t>()[5], 5 * 10 + 7 + 100);
  EXPECT_EQ(cuda::allocator_stats(gpu).pinned_allocs, pinned) << "a second round pinned new memory";
}
