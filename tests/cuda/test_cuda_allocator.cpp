// The caching allocator (tensor/cuda/allocator.h): live and peak bytes in
// memory_stats(cuda:N) as on the CPU, blocks reused so a steady-state step
// makes no cudaMalloc, and out of memory as a message with the numbers.
#include <gmock/gmock.h>

#include "cuda_test.h"
#include "tensor/cuda/allocator.h"

using namespace loom;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(CudaAllocatorSizes, RoundToBucketsOf512BytesThen2MiB) {  // no GPU needed
  EXPECT_EQ(cuda::rounded_block_size(0), 0u);
  EXPECT_EQ(cuda::rounded_block_size(1), 512u);
  EXPECT_EQ(cuda::rounded_block_size(1000), 1024u);
  EXPECT_EQ(cuda::rounded_block_size(1 << 20), size_t(1) << 20);
  EXPECT_EQ(cuda::rounded_block_size((1 << 20) + 1), size_t(2) << 20);
  EXPECT_EQ(cuda::rounded_block_size(3000000), size_t(4) << 20);
}

using CudaAllocator = cuda_test::CudaTest;

TEST_F(CudaAllocator, LiveAndPeakBytesFollowTensors) {
  reset_peak_memory_stats(gpu);
  const int64_t live0 = memory_stats(gpu).live_bytes;
  {
    Tensor a = empty({1000}, kFloat32, gpu);
    EXPECT_EQ(memory_stats(gpu).live_bytes, live0 + 4000);
    {
      Tensor b = empty({250}, kFloat64, gpu);
      EXPECT_EQ(memory_stats(gpu).live_bytes, live0 + 6000);
    }
    EXPECT_EQ(memory_stats(gpu).live_bytes, live0 + 4000);
  }
  EXPECT_EQ(memory_stats(gpu).live_bytes, live0);
  EXPECT_EQ(memory_stats(gpu).peak_bytes, live0 + 6000);
}

TEST_F(CudaAllocator, ASteadyStateStepMakesNoDeviceAllocation) {
  Tensor w = ops::to(cuda_test::random({64, 32}, 1), gpu);
  auto step = [&] {  // the same shapes every step, as in training
    Tensor x = ops::to(cuda_test::random({16, 32}, 2), gpu);
    Tensor y = ops::gelu(ops::linear(x, w, Tensor()));
    Tensor loss = ops::sum(ops::mul(y, y));
    return loss.item<double>();
  };
  const double first = step();
  const cuda::AllocatorStats after_first = cuda::allocator_stats(gpu);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(step(), first);  // and the same bits
  const cuda::AllocatorStats after = cuda::allocator_stats(gpu);
  EXPECT_EQ(after.device_allocs, after_first.device_allocs);
  EXPECT_EQ(after.device_frees, after_first.device_frees);
  EXPECT_EQ(after.reserved_bytes, after_first.reserved_bytes);
}

TEST_F(CudaAllocator, EmptyCacheGivesFreeBlocksBack) {
  { Tensor t = empty({1 << 20}, kFloat32, gpu); }  // 4 MiB, now cached
  cuda::AllocatorStats before = cuda::allocator_stats(gpu);
  EXPECT_GE(before.cached_bytes, 4 << 20);
  cuda::empty_cache(gpu);
  cuda::AllocatorStats after = cuda::allocator_stats(gpu);
  EXPECT_EQ(after.cached_bytes, 0);
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes - before.cached_bytes);
  EXPECT_GT(after.device_frees, before.device_frees);
}

TEST_F(CudaAllocator, OutOfMemoryNamesTheBytesTheDeviceAndWhatLoomHolds) {
  const int64_t n = int64_t(1) << 48;  // 1 PiB of float32
  EXPECT_THAT([&] { empty({n}, kFloat32, gpu); },
              ThrowsMessage<Error>(AllOf(HasSubstr("out of memory on cuda:0"),
                                         HasSubstr("cannot allocate " + std::to_string(4 * n) + " bytes"),
                                         HasSubstr("free of"), HasSubstr("total"), HasSubstr("loom holds"),
                                         HasSubstr("in live tensors"))));
  Tensor ok = zeros({4}, kFloat32, gpu);  // the device still works
  EXPECT_EQ(ok.to_vector<float>(), (std::vector<float>{0, 0, 0, 0}));
}
