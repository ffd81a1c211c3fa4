// The collective watchdog on NCCL work (parallel/comm/nccl_in_flight.h): each
// test runs nccl_watchdog_job.cpp under mpiexec and reads what it printed.
// A stuck all-reduce must end the job within seconds, naming the group, op,
// sequence number and bytes (2 GPUs: NCCL refuses two ranks on one); an
// all-reduce that waits behind long kernels must not count as stuck (1 GPU).
// Without a GPU, or without NCCL, they skip with the reason.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <regex>
#include <string>

#include "../run_command.h"
#include "cuda_test.h"
#include "parallel/comm/process_group_nccl.h"

using namespace loom;
using loom::test::Exec;
using loom::test::run_command;

namespace {

class NcclWatchdog : public cuda_test::CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    if (!parallel::built_with_nccl()) GTEST_SKIP() << "loom was built without NCCL";
  }
  // `timeout 120` bounds a watchdog that never fires: the test then fails, not hangs.
  static Exec job(int ranks, const std::string& mode, int timeout_s) {
    return run_command("LOOM_COLLECTIVE_TIMEOUT=" + std::to_string(timeout_s) + " timeout 120 " +
                       std::string(LOOM_MPIEXEC) + " --allow-run-as-root --oversubscribe -np " +
                       std::to_string(ranks) + " " + LOOM_NCCL_WATCHDOG_JOB + " " + mode + " 2>&1");
  }
};

TEST_F(NcclWatchdog, AStuckAllReduceEndsTheJobNamingIt) {
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs (NCCL refuses two ranks on one)";
  const auto t0 = std::chrono::steady_clock::now();
  Exec e = job(2, "hang", 3);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(e.status, 0) << e.output;
  EXPECT_LT(seconds, 60) << "the job should end a few seconds after the 3 s timeout\n" << e.output;
  EXPECT_TRUE(std::regex_search(e.output, std::regex("rank 0\\] collective watchdog: stuck for [0-9]+ s in "
                                                     "all_reduce\\(sum, float32\\) #1 \\(4096 bytes\\) on group "
                                                     "world \\(size 2, NCCL\\)")))
      << e.output;
}

TEST_F(NcclWatchdog, AnAllReduceQueuedBehindLongKernelsIsNotStuck) {
  Exec e = job(1, "slow", 2);
  ASSERT_EQ(e.status, 0) << e.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(e.output, m, std::regex("slow: done after ([0-9.]+) s .* sum ([0-9]+)"))) << e.output;
  // The all-reduce waited longer than the timeout, and the watchdog let it.
  EXPECT_GT(std::stod(m[1].str()), 2.0) << e.output;
  EXPECT_EQ(m[2].str(), "1024");  // one rank: the all-reduce leaves the ones as they are
}

}  // namespace
