// train_gpt across hosts equals one process: the runs of
// test_train_gpt_parallel.cpp, launched by mpirun on h0 over the hosts of
// tests/multihost/hosts.sh (each test is one CTest test inside its own set of
// hosts; see CMakeLists.txt here). MPI's messages between hosts cross a veth
// and a bridge by TCP; within a host they use shared memory.
#include <gtest/gtest.h>

#include <cstdlib>
#include <algorithm>
#include <fstream>
#include <map>
#include <regex>

#include "tests/train_gpt_run.h"

using namespace loom;
using namespace loom::test;

namespace {

// Launch through hosts.sh's mpirun (LOOM_MH_MPIRUN: examples/launch.sh on
// h0, which prints where each rank runs); without it, skip.
bool on_hosts() {
  const char* mpirun = std::getenv("LOOM_MH_MPIRUN");
  if (!mpirun) return false;
  setenv("LOOM_TEST_LAUNCHER", mpirun, 1);
  return true;
}

// The run really was spread: mpirun's map puts `procs` ranks on each of h0 and h1.
void expect_on_two_hosts(const Result& r, int procs) {
  for (const char* host : {"h0", "h1"})
    EXPECT_NE(r.output.find(str("Data for node: ", host, "\tNum slots: ", procs, "\tMax slots: 0\tNum procs: ", procs)),
              std::string::npos)
        << host << "\n" << r.output;
}

}  // namespace

#define REQUIRE_HOSTS() \
  if (!on_hosts()) GTEST_SKIP() << "run inside tests/multihost/hosts.sh (ctest -L multihost)"

// hostfile: h0 slots=1, h1 slots=1 -> rank 0 on h0, rank 1 on h1.
TEST(Multihost, DataParallelAcrossTwoHostsMatchesOneProcess) {
  REQUIRE_HOSTS();
  Result r = train("mh_dp2", 2, "--dp 2 --batch 8");
  expect_on_two_hosts(r, 1);
  expect_same_run(r, single_process_batch16(), "--dp 2 over 2 hosts");
}

// slots=2, and the grid in Megatron's order (tp, then dp, then pp;
// parallel/process_group_manager.h): ranks 0, 1 (stage 0 of both replicas)
// on h0, ranks 2, 3 (stage 1) on h1. The dp all-reduce stays inside each
// host, the pipeline's activations cross between them.
TEST(Multihost, DataAndPipelineParallelAcrossTwoHostsMatchesOneProcess) {
  REQUIRE_HOSTS();
  Result r = train("mh_dp2_pp2", 4, "--dp 2 --pp 2 --microbatches 2 --batch 4");
  expect_on_two_hosts(r, 2);
  expect_same_run(r, single_process_batch16(), "--dp 2 --pp 2 over 2 hosts");
  expect_tied_copies_identical("mh_dp2_pp2");
}

// slots=2: replica 0's tp pair (ranks 0, 1) on h0, replica 1's on h1; the dp
// all-reduce crosses hosts, tp's per-layer all-reduces never do.
TEST(Multihost, TensorParallelInsideAHostDataParallelAcrossMatchesOneProcess) {
  REQUIRE_HOSTS();
  Result r = train("mh_dp2_tp2", 4, "--dp 2 --tp 2 --batch 8");
  expect_on_two_hosts(r, 2);
  expect_same_run(r, single_process_batch16(), "--tp 2 in a host, --dp 2 over 2 hosts");
}

// 5 steps on two hosts, sharded (ZeRO: each host writes its own optimizer
// shard into the shared folder), then 5 more steps by one process.
TEST(Multihost, CheckpointSavedAcrossHostsResumesOnOneHost) {
  REQUIRE_HOSTS();
  Result first = train("mh_resume", 2, "--dp 2 --batch 8 --zero --stop-at 5");
  ASSERT_EQ(first.status, 0) << first.output;
  expect_on_two_hosts(first, 1);
  ASSERT_TRUE(fs::exists(work_dir() / "mh_resume.step5.optim.1.safetensors")) << "the shard of rank 1 (on h1)";
  unsetenv("LOOM_TEST_LAUNCHER");
  expect_same_run(train("mh_resume", 1, "--batch 16 --resume " + checkpoint("mh_resume")), single_process_batch16(),
                  "--zero dp 2 over 2 hosts -> save -> one process");
}

// --trace over two hosts whose steady clocks are 1000 s apart (on_host.sh
// gives each host a time namespace): one file, a row per rank, each labelled
// with its measured offset; the same all-reduce ends at about the same moment
// on both rows (it cannot end on one rank long before the other has sent its
// half). Each rank counts from its own zero, so the 1000 s never shows; what
// could is a zero taken at another moment or an offset applied wrongly (a
// unit slip: microseconds as seconds). Measured on the 2-core machine under
// other builds' load: within +-0.2 to +-4 ms, the ends 0.2 to 4 ms apart; the
// limits (50 ms, error + 20 ms) catch such gross errors, not the last
// millisecond (tests/test_clock_sync.cpp checks the estimate itself).
TEST(Multihost, TraceFromTwoHostsIsOnRankZerosClock) {
  REQUIRE_HOSTS();
  fs::path path = work_dir() / "mh_trace.json";
  Result r = train("mh_trace", 2, "--dp 2 --batch 8 --trace " + path.string());
  ASSERT_EQ(r.status, 0) << r.output;
  expect_on_two_hosts(r, 1);
  std::ifstream f(path);
  std::map<int, double> error_us;                 // rank -> the clock's error bound
  std::map<std::string, double> end_us[2];        // all-reduce "#k" -> its end, per rank
  std::regex label(R"re("pid": (\d+), "args": \{"labels": "clock: rank 0's [-+0-9.]+ us, within \+-([0-9.]+) us")re");
  std::regex all_reduce(R"re("name": "all_reduce\(avg, float32\) dp \(size 2\) (#\d+) [^"]*", "ph": "X", )re"
                        R"re("ts": ([0-9.]+), "dur": ([0-9.]+), "pid": (\d+), "tid": 1)re");
  std::smatch m;
  for (std::string line; std::getline(f, line);) {
    if (std::regex_search(line, m, label)) error_us[std::stoi(m[1])] = std::stod(m[2]);
    if (std::regex_search(line, m, all_reduce)) end_us[std::stoi(m[4])][m[1]] = std::stod(m[2]) + std::stod(m[3]);
  }
  ASSERT_EQ(error_us.size(), 2u) << "a clock label per rank";
  EXPECT_EQ(error_us[0], 0) << "rank 0 is the reference";
  EXPECT_LT(error_us[1], 50000) << "half the best of 16 round trips";
  ASSERT_EQ(end_us[0].size(), 10u) << "one gradient all-reduce a step";
  ASSERT_EQ(end_us[1].size(), 10u);
  std::vector<double> gaps;
  for (auto& [k, end] : end_us[0]) gaps.push_back(std::abs(end - end_us[1].at(k)));
  std::sort(gaps.begin(), gaps.end());
  const double median = gaps[gaps.size() / 2];
  std::printf("[ measured ] rank 1's clock within +-%.1f us of rank 0's; the all-reduces' ends %.1f us apart "
              "(median)\n",
              error_us[1], median);
  EXPECT_LT(median, error_us[1] + 20000) << "rank 1's row is not on rank 0's clock";
}

// The same job launched by Slurm (tests/multihost/slurm.sh: slurmctld on h0,
// a slurmd on each host; srun --mpi=pmix through examples/launch.sh --srun)
// and by mpirun: the same ranks on the same hosts doing the same sums in the
// same order, so the two runs are bit-identical, and both equal one process.
TEST(Multihost, SrunAcrossTwoHostsEqualsMpirunAndOneProcess) {
  const char* srun = std::getenv("LOOM_MH_SRUN");
  if (!srun) GTEST_SKIP() << "run inside tests/multihost/hosts.sh and slurm.sh (ctest -L multihost)";
  REQUIRE_HOSTS();
  Result by_mpirun = train("mh_mpirun", 2, "--dp 2 --batch 8");
  ASSERT_EQ(by_mpirun.status, 0) << by_mpirun.output;
  expect_on_two_hosts(by_mpirun, 1);

  setenv("LOOM_TEST_LAUNCHER", srun, 1);
  Result by_srun = train("mh_srun", 2, "--dp 2 --batch 8");
  ASSERT_EQ(by_srun.status, 0) << by_srun.output;
  // srun -v: where each task runs (rank 0 on h0, rank 1 on h1), and that it spoke PMIx.
  for (const char* line : {"launching StepId=1.0 on host h0, 1 tasks: 0", "launching StepId=1.0 on host h1, 1 tasks: 1",
                           "mpi                 : pmix"})
    EXPECT_NE(by_srun.output.find(line), std::string::npos) << line << "\n" << by_srun.output;

  ASSERT_EQ(by_srun.losses.size(), 10u) << by_srun.output;
  EXPECT_EQ(by_srun.losses, by_mpirun.losses) << "srun and mpirun, the same job";
  EXPECT_EQ(by_srun.grad_norms, by_mpirun.grad_norms);
  ASSERT_EQ(by_srun.weights.tensors.size(), by_mpirun.weights.tensors.size());
  for (auto& [name, t] : by_mpirun.weights.tensors)
    EXPECT_EQ(by_srun.weights.at(name).to_vector<float>(), t.to_vector<float>()) << name;
  expect_same_run(by_srun, single_process_batch16(), "--dp 2 over 2 hosts, launched by srun");
}
