// The launch counter's host side (tensor/cuda/launch_count.h), on the CPU:
// windows over the process-wide count, counting from several threads, and
// that CPU work counts nothing (a CUDA build runs CPU tensors as a CPU-only
// build does). That each GPU launch counts once is
// tests/cuda/test_cuda_launch_count.cpp's (it needs a GPU).
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "tensor/cuda/launch_count.h"
#include "tensor/ops.h"

using namespace loom;

TEST(LaunchCount, AWindowCountsTheLaunchesSinceItsStart) {
  cuda::LaunchWindow w;
  EXPECT_EQ(w.count(), 0);
  cuda::count_launch();
  cuda::count_launch(3);
  EXPECT_EQ(w.count(), 4);
  cuda::LaunchWindow inner;  // windows nest: each sees only what came after its start
  cuda::count_launch(2);
  EXPECT_EQ(inner.count(), 2);
  EXPECT_EQ(w.count(), 6);
}

TEST(LaunchCount, RestartGivesOneStepsCountThenTheNext) {
  cuda::LaunchWindow w;
  cuda::count_launch(5);
  EXPECT_EQ(w.restart(), 5);  // step 1
  EXPECT_EQ(w.count(), 0);
  cuda::count_launch(7);
  EXPECT_EQ(w.restart(), 7);  // step 2: not 12
  EXPECT_EQ(w.restart(), 0);  // step 3 launched nothing
}

TEST(LaunchCount, ThreadsAddUpWithoutLosingCounts) {
  // train_gpt --backend mpi launches from the compute thread and the communication thread.
  // All start together (a spin on `go`), so their increments interleave: a lost update would show.
  cuda::LaunchWindow w;
  constexpr int kThreads = 4, kEach = 200000;
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      for (int i = 0; i < kEach; ++i) cuda::count_launch();
    });
  while (ready.load() < kThreads) std::this_thread::yield();
  go.store(true);
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(w.count(), int64_t(kThreads) * kEach);
}

TEST(LaunchCount, CpuOpsLaunchNothing) {
  cuda::LaunchWindow w;
  Tensor a = ops::reshape(arange(0.0, 12.0, 1.0, kFloat32), {3, 4});
  Tensor y = ops::add(ops::matmul(a, ops::transpose(a, 0, 1)), 1.0);
  ops::zero_(y);
  EXPECT_EQ(w.count(), 0);
}
