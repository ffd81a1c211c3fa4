// Idle math threads sleep instead of spinning (tensor/cpu/thread_wait.h):
// loom starts OpenMP with OMP_WAIT_POLICY=passive unless the user set it.
//
// CTest runs this binary twice (tests/CMakeLists.txt): with OMP_WAIT_POLICY
// and GOMP_SPINCOUNT unset (LOOM_EXPECT_WAIT_POLICY=passive), and with the
// user's OMP_WAIT_POLICY=active (LOOM_EXPECT_WAIT_POLICY=active), which loom
// must leave alone - and which shows that the CPU-time test below can see a
// spinning thread.
#include <gtest/gtest.h>

#include <time.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "tensor/cpu/thread_wait.h"
#include "tensor/ops.h"
#include "tensor/parallel.h"

using namespace loom;

namespace {

std::string expected_policy() {
  const char* e = std::getenv("LOOM_EXPECT_WAIT_POLICY");
  return e ? e : "";
}

double cpu_seconds(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

}  // namespace

TEST(ThreadWait, PolicyIsPassiveUnlessTheUserSetIt) {
  const std::string want = expected_policy();
  if (want.empty()) GTEST_SKIP() << "run through CTest (thread_wait_default, thread_wait_user), which sets "
                                    "LOOM_EXPECT_WAIT_POLICY";
  const char* now = std::getenv("OMP_WAIT_POLICY");
  ASSERT_NE(now, nullptr) << cpu::omp_wait_policy();
  EXPECT_EQ(std::string(now), want);
  const std::string words = cpu::omp_wait_policy();
  if (want == "passive") EXPECT_EQ(words, "OMP_WAIT_POLICY=passive (loom's default)");
  else EXPECT_EQ(words, "OMP_WAIT_POLICY=" + want + " (set by the user)");
}

// After a parallel loop on 2 threads the main thread sleeps 200 ms: the
// process's CPU time in that sleep is what the idle worker burned. Passive:
// ~0 (it sleeps on a futex at once). Active: it spins the whole time, so
// the same measurement reads tens of milliseconds, even on a loaded machine.
TEST(ThreadWait, AnIdleWorkerBurnsNoCpuWhilePassive) {
  const std::string want = expected_policy();
  if (want.empty()) GTEST_SKIP() << "run through CTest, which sets LOOM_EXPECT_WAIT_POLICY";
  const int before = ops::get_num_threads();
  ops::set_num_threads(2);
  std::vector<float> out(1 << 16);
  parallel_for(int64_t(out.size()), 1024, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[size_t(i)] = float(i) * 0.5f;
  });
  const double process0 = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID), main0 = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double idle_workers_ms =
      1e3 * ((cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - process0) - (cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - main0));
  ops::set_num_threads(before);
  EXPECT_EQ(out[100], 50.0f);
  if (want == "passive") EXPECT_LT(idle_workers_ms, 5.0) << "the idle OpenMP thread spun while the main thread slept";
  else EXPECT_GT(idle_workers_ms, 20.0) << "OMP_WAIT_POLICY=active should spin: the measurement cannot see it";
}

// Started over, the process keeps its name: ps, top and pgrep show the
// program, not "exe" (the start-over goes through the program's own path).
TEST(ThreadWait, TheProcessKeepsItsName) {
  std::ifstream comm("/proc/self/comm");
  std::string name;
  std::getline(comm, name);
  if (name.empty()) GTEST_SKIP() << "no /proc/self/comm";
  EXPECT_EQ(name, std::string("test_thread_wait").substr(0, 15));  // the kernel keeps 15 characters
  EXPECT_NE(name, "exe");
}
