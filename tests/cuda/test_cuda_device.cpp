// How a CUDA build behaves around devices: CPU tensors exactly as without
// CUDA; a CUDA tensor refused with a clear message where no GPU exists; device
// indices past the last GPU, ops with no CUDA path, mixed devices and bad
// indices found by a kernel each a loom::Error that says what happened; and
// the CUDA_CHECK / CUBLAS_CHECK macros carrying file:line and CUDA's message.
#include <gmock/gmock.h>

#include <thread>

#include "../run_command.h"
#include "cuda_test.h"
#include "tensor/cuda/check.h"

using namespace loom;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(CudaBuild, CpuTensorsWorkAsWithoutCuda) {
  EXPECT_TRUE(built_with_cuda());
  Tensor a = tensor({1, 2, 3}), b = tensor({10, 20, 30});
  EXPECT_EQ(ops::add(a, b).to_vector<float>(), (std::vector<float>{11, 22, 33}));
  EXPECT_EQ(ops::sum(a).item<float>(), 6.0f);
  EXPECT_EQ(a.device(), kCPU);
  EXPECT_EQ(ops::to(a, kCPU).impl(), a.impl());  // to the device it is on: the same tensor
}

TEST(CudaBuild, WithoutGpuACudaTensorIsRefusedWithTheReason) {
  if (cuda::is_available()) GTEST_SKIP() << "this machine has a GPU; the no-GPU path cannot be seen here";
  EXPECT_EQ(cuda::device_count(), 0);
  auto refused = AllOf(HasSubstr("device cuda:0"), HasSubstr("no CUDA device is available"),
                       HasSubstr("only CPU tensors can be made"));
  EXPECT_THAT([] { empty({2}, kFloat32, Device("cuda:0")); }, ThrowsMessage<Error>(refused));
  EXPECT_THAT([] { ops::to(tensor({1, 2}), Device("cuda")); }, ThrowsMessage<Error>(refused));
  EXPECT_THAT([] { zeros({2, 3}, kBFloat16, Device("cuda:0")); }, ThrowsMessage<Error>(refused));
  EXPECT_EQ(memory_stats(Device("cuda:0")).live_bytes, 0);
}

TEST(CudaBuild, CudaCheckCarriesFileLineAndCudasMessage) {
  EXPECT_THAT([] { CUDA_CHECK(cudaErrorInvalidValue); },
              ThrowsMessage<Error>(AllOf(HasSubstr("test_cuda_device.cpp:"), HasSubstr("cudaErrorInvalidValue"),
                                         HasSubstr("invalid argument"))));
  EXPECT_THAT([] { CUBLAS_CHECK(CUBLAS_STATUS_NOT_INITIALIZED); },
              ThrowsMessage<Error>(AllOf(HasSubstr("cuBLAS error at"), HasSubstr("test_cuda_device.cpp:"),
                                         HasSubstr("CUBLAS_STATUS_NOT_INITIALIZED"))));
}

TEST(CudaBuild, Tf32IsOffByDefault) {  // GEMMs keep full fp32 products unless asked (--tf32)
  EXPECT_FALSE(cuda::allow_tf32());
  cuda::set_allow_tf32(true);
  EXPECT_TRUE(cuda::allow_tf32());
  cuda::set_allow_tf32(false);
}

// The programs the GPU tests launch are found at run time, so a bundle built
// in one folder runs from another (tests/cuda/build_bundle.sh).
TEST(CudaBuild, ProgramsAreFoundAtRunTime) {
  using loom::test::program_path;
  ::setenv("LOOM_TEST_PROGRAM", "/from/the/environment", 1);
  EXPECT_EQ(program_path("LOOM_TEST_PROGRAM", "test_cuda_device", "../nonexistent"), "/from/the/environment");
  ::unsetenv("LOOM_TEST_PROGRAM");
  // Beside this test binary comes first...
  const std::string self = program_path("LOOM_TEST_PROGRAM", "test_cuda_device", "/bin/sh");
  EXPECT_THAT(self, ::testing::EndsWith("/test_cuda_device"));
  EXPECT_EQ(access(self.c_str(), X_OK), 0) << self;
  // ...then the build tree's place (relative to this binary, or absolute), else the bare name for PATH.
  const std::string dir = self.substr(0, self.rfind('/') + 1);
  EXPECT_EQ(program_path("LOOM_TEST_PROGRAM", "no_such_program", "./test_cuda_device"), dir + "./test_cuda_device");
  EXPECT_EQ(program_path("LOOM_TEST_PROGRAM", "no_such_program", "/bin/sh"), "/bin/sh");
  EXPECT_EQ(program_path("LOOM_TEST_PROGRAM", "no_such_program", "../nonexistent/train_gpt"), "no_such_program");
}

using CudaDevice = cuda_test::CudaTest;

TEST_F(CudaDevice, AnIndexPastTheLastGpuNamesHowManyExist) {
  const int n = cuda::device_count();
  const Device past("cuda:" + std::to_string(n));
  EXPECT_THAT([&] { empty({2}, kFloat32, past); },
              ThrowsMessage<Error>(AllOf(HasSubstr(past.str()), HasSubstr("past the last GPU"),
                                         HasSubstr("this machine has " + std::to_string(n) + " CUDA device"))));
}

TEST_F(CudaDevice, HostCodeReadingGpuMemorySaysSo) {
  Tensor x = ops::to(tensor({1, 2, 3, 4}, {2, 2}), gpu);
  EXPECT_THAT([&] { x.data<float>(); }, ThrowsMessage<Error>(HasSubstr("host code cannot read GPU memory")));
}

TEST_F(CudaDevice, MixingDevicesNamesBoth) {
  Tensor a = tensor({1, 2}), b = ops::to(a, gpu);
  EXPECT_THAT([&] { ops::add(a, b); }, ThrowsMessage<Error>(HasSubstr("add: devices differ: cpu and cuda:0")));
  EXPECT_THAT([&] { ops::mul(b, a); }, ThrowsMessage<Error>(HasSubstr("mul: devices differ: cuda:0 and cpu")));
  EXPECT_THAT([&] { ops::matmul(ops::view(a, {1, 2}), ops::view(b, {2, 1})); },
              ThrowsMessage<Error>(HasSubstr("devices differ")));
}

TEST_F(CudaDevice, ABadIndexFoundByAKernelIsThrownAtTheNextSync) {
  Tensor w = ops::to(cuda_test::random({65, 8}, 1), gpu);
  Tensor idx = ops::to(from_vector(std::vector<int64_t>{3, 70, 5}), gpu);
  Tensor out = ops::embedding(w, idx);  // enqueued; the kernel notes index 70
  EXPECT_THAT([&] { out.to_vector<float>(); },
              ThrowsMessage<Error>(AllOf(HasSubstr("embedding: index 70 out of range for 65 rows"),
                                         HasSubstr("cuda:0"))));
  EXPECT_EQ(ops::embedding(w, ops::narrow(idx, 0, 0, 1)).to_vector<float>().size(), 8u);  // reported once, then clear
  Tensor picked = ops::index_select(w, 0, ops::to(from_vector(std::vector<int64_t>{2, 65}), gpu));
  EXPECT_THAT([&] { cuda::synchronize(gpu); },
              ThrowsMessage<Error>(HasSubstr("index_select: index 65 out of range for size 65")));
}

// The record lives in device memory: the first bad index of the kernels
// enqueued before a synchronisation is the one reported (a later kernel's
// claim fails), and after the report the record is clear again.
TEST_F(CudaDevice, TheFirstBadIndexBeforeASyncIsTheOneReported) {
  Tensor w = ops::to(cuda_test::random({65, 8}, 1), gpu);
  Tensor first = ops::embedding(w, ops::to(from_vector(std::vector<int64_t>{80}), gpu));
  Tensor second = ops::index_select(w, 0, ops::to(from_vector(std::vector<int64_t>{66}), gpu));
  EXPECT_THAT([&] { cuda::synchronize(gpu); },
              ThrowsMessage<Error>(HasSubstr("embedding: index 80 out of range for 65 rows")));
  EXPECT_NO_THROW(cuda::synchronize(gpu));
  EXPECT_NO_THROW(second.to_vector<float>());
}

// A thread's first guard sets its device for good: a thread that only works
// on cuda:1 must not be sent back to cuda:0 (that would make a context there
// for every rank's comm and watchdog threads).
TEST_F(CudaDevice, AThreadStaysOnTheDeviceItFirstUsed) {
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs (not run: one GPU)";
  int after = -1;
  std::thread t([&] {
    Tensor x = ops::to(tensor({1, 2}), Device("cuda:1"));
    x = ops::add(x, x);
    cuda::synchronize(Device("cuda:1"));
    CUDA_CHECK(cudaGetDevice(&after));
  });
  t.join();
  EXPECT_EQ(after, 1) << "a guard restored the runtime's default device 0";
}
