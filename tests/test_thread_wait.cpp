// Math threads that do not fight the laptop: idle ones spin briefly, then
// sleep (tensor/cpu/thread_wait.h: loom starts OpenMP with GOMP_SPINCOUNT=10000
// unless the user chose), and parallel loops wake them only while the cores
// are free (tensor/cpu/core_watch.h), with the same numbers either way.
//
// CTest runs this binary twice (tests/CMakeLists.txt): with OMP_WAIT_POLICY
// and GOMP_SPINCOUNT unset (LOOM_EXPECT_WAIT_POLICY=bounded), and with the
// user's OMP_WAIT_POLICY=active (LOOM_EXPECT_WAIT_POLICY=active), which loom
// must leave alone - and which shows that the CPU-time test below can see a
// spinning thread.
#include <gtest/gtest.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "tensor/cpu/core_watch.h"
#include "tensor/cpu/thread_wait.h"
#include "tensor/generator.h"
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

TEST(ThreadWait, SpinIsBoundedUnlessTheUserChose) {
  const std::string want = expected_policy();
  if (want.empty()) GTEST_SKIP() << "run through CTest (thread_wait_default, thread_wait_user), which sets "
                                    "LOOM_EXPECT_WAIT_POLICY";
  const std::string words = cpu::omp_wait_policy();
  if (want == "bounded") {
    const char* spin = std::getenv("GOMP_SPINCOUNT");
    ASSERT_NE(spin, nullptr) << words;
    EXPECT_EQ(std::string(spin), "10000");
    EXPECT_EQ(std::getenv("OMP_WAIT_POLICY"), nullptr);
    EXPECT_EQ(words, "GOMP_SPINCOUNT=10000 (loom's default)");
  } else {
    const char* now = std::getenv("OMP_WAIT_POLICY");
    ASSERT_NE(now, nullptr) << words;
    EXPECT_EQ(std::string(now), want);
    EXPECT_EQ(words, "OMP_WAIT_POLICY=" + want + " (set by the user)");
  }
}

// After a parallel loop on 2 threads the main thread sleeps 200 ms: the
// process's CPU time in that sleep is what the idle worker burned. Bounded:
// well under a millisecond of spinning, then it sleeps on a futex. Active: it
// spins the whole time, so the same measurement reads tens of milliseconds,
// even on a loaded machine. (CTest sets LOOM_WAKE_THREADS=always: on a busy
// machine the loop would not wake the worker at all.)
TEST(ThreadWait, AnIdleWorkerSoonStopsSpinning) {
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
  if (want == "bounded") EXPECT_LT(idle_workers_ms, 5.0) << "the idle OpenMP thread spun while the main thread slept";
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

// The core watch's arithmetic, on /proc's own text.
TEST(CoreWatch, ReadsTheTicksOfTheListedCpus) {
  const std::string stat =
      "cpu  300 10 100 1000 50 5 5 0 0 0\n"
      "cpu0 100 0 50 500 20 0 0 0 0 0\n"
      "cpu1 200 10 50 500 30 5 5 0 0 0\n"
      "intr 12345 0 0\n";
  const cpu::CpuTicks all = cpu::parse_proc_stat(stat, {});
  EXPECT_EQ(all.total, 1470u);  // user..steal
  EXPECT_EQ(all.busy, 420u);    // less idle and iowait
  const cpu::CpuTicks one = cpu::parse_proc_stat(stat, {1});
  EXPECT_EQ(one.total, 800u);
  EXPECT_EQ(one.busy, 270u);
  // The name may hold spaces and parentheses; utime 7 and stime 3 are fields 14 and 15.
  EXPECT_EQ(cpu::parse_self_ticks("4242 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 7 3 0 0 20 0 3 0"), 10u);
}

// Wake the other threads only when the cores left hold them all (half a core of slack).
TEST(CoreWatch, WakesOnlyWhenTheCoresAreFree) {
  EXPECT_TRUE(cpu::cores_free_for(0.0, 2, 2));   // a quiet 2-core laptop
  EXPECT_TRUE(cpu::cores_free_for(0.4, 2, 2));   // a browser idling
  EXPECT_FALSE(cpu::cores_free_for(1.0, 2, 2));  // a build on one core (issue 34's case)
  EXPECT_FALSE(cpu::cores_free_for(1.0, 2, 2));
  EXPECT_TRUE(cpu::cores_free_for(1.0, 4, 2));   // room elsewhere
  EXPECT_FALSE(cpu::cores_free_for(3.0, 4, 2));
}

// Run in turn or by two threads, the same chunks give the same bits: the
// chunks parallel_for hands out are the same, and so are a split GEMM's
// numbers (gemm.h: the split decides the bits) and a per-row op's.
TEST(CoreWatch, NotWakingTheThreadsChangesNoNumber) {
  const int before = ops::get_num_threads();
  ops::set_num_threads(2);
  Generator gen(7);
  const Tensor a = randn({257, 300}, gen), b = randn({300, 129}, gen);
  auto run = [&](cpu::Wake wake) {
    cpu::set_wake(wake);
    std::vector<std::pair<int64_t, int64_t>> chunks;
    std::mutex m;
    parallel_for(100000, 1024, [&](int64_t begin, int64_t end) {
      std::lock_guard<std::mutex> hold(m);
      chunks.emplace_back(begin, end);
    });
    std::sort(chunks.begin(), chunks.end());
    Tensor c = ops::contiguous(ops::softmax(ops::matmul(a, b)));
    return std::make_pair(chunks, std::vector<float>(c.data<float>(), c.data<float>() + c.numel()));
  };
  const auto woken = run(cpu::Wake::kAlways), in_turn = run(cpu::Wake::kNever);
  cpu::set_wake(cpu::Wake::kAuto);
  ops::set_num_threads(before);
  ASSERT_EQ(woken.first.size(), 2u);  // two threads' chunks, [0, 50000) and [50000, 100000)
  EXPECT_EQ(woken.first, in_turn.first);
  ASSERT_EQ(woken.second.size(), in_turn.second.size());
  EXPECT_EQ(std::memcmp(woken.second.data(), in_turn.second.data(), woken.second.size() * sizeof(float)), 0);
}

// Whole tasks split evenly, elements at multiples of 16: attention's 48
// products (medium GPT: batch 8 x 6 heads) go 24 + 24 at 2 threads; split
// as elements they went 16 + 32, and the 2-thread step waited for the
// thread with twice the attention.
TEST(CoreWatch, TasksSplitEvenlyAndElementsAtMultiplesOf16) {
  const int before = ops::get_num_threads();
  ops::set_num_threads(2);
  using Chunks = std::vector<std::pair<int64_t, int64_t>>;
  auto chunks_of = [](auto split) {
    Chunks chunks;
    std::mutex m;
    split([&](int64_t begin, int64_t end) {
      std::lock_guard<std::mutex> hold(m);
      chunks.emplace_back(begin, end);
    });
    std::sort(chunks.begin(), chunks.end());
    return chunks;
  };
  const Chunks tasks = chunks_of([](const auto& fn) { parallel_for_tasks(48, fn); });
  const Chunks odd = chunks_of([](const auto& fn) { parallel_for_tasks(5, fn); });
  const Chunks elements = chunks_of([](const auto& fn) { parallel_for(48, 1, fn); });
  const Chunks one = chunks_of([](const auto& fn) { parallel_for_tasks(1, fn); });
  ops::set_num_threads(before);
  EXPECT_EQ(tasks, (Chunks{{0, 24}, {24, 48}}));
  EXPECT_EQ(odd, (Chunks{{0, 2}, {2, 5}}));
  EXPECT_EQ(elements, (Chunks{{0, 16}, {16, 48}}));
  EXPECT_EQ(one, (Chunks{{0, 1}}));
}
