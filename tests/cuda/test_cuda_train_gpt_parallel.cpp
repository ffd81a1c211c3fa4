// Every parallel mode of train_gpt on GPU tensors against the single-GPU run,
// with the tolerances of tests/test_train_gpt_parallel.cpp (the CPU's parity
// tests; tests/train_gpt_run.h explains them). The ranks share one GPU and
// exchange its tensors over MPI through host memory (--backend mpi), since
// NCCL refuses two ranks on one GPU. Skipped, with the reason, without a GPU;
// none of these has run on a GPU yet. The tests named for NCCL need two GPUs.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "../moe_runs.h"
#include "../train_gpt_run.h"
#include "cuda_test.h"

using namespace loom;
using namespace loom::test;

namespace {

const std::string kGpu = " --device cuda --backend mpi ";

// One track of one rank in a --trace file: its complete ("X") spans named
// `name` (all of them when empty), in file order, as [begin, end) in us.
struct TraceSpan {
  std::string name;
  double begin, end;
};
std::vector<TraceSpan> spans_on(const nlohmann::json& trace, int rank, int tid, const std::string& name = "") {
  std::vector<TraceSpan> out;
  for (const auto& e : trace["traceEvents"])
    if (e.value("ph", "") == "X" && e.value("pid", -1) == rank && e.value("tid", -1) == tid &&
        (name.empty() || e.value("name", "") == name))
      out.push_back({e["name"], e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()});
  return out;
}
nlohmann::json read_trace(const fs::path& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

class CudaTrainGptParallel : public cuda_test::CudaTest {
 protected:
  // The reference: one process on the GPU, the whole batch of 16 sequences.
  static const Result& one_gpu() {
    static Result r = train("gpu_single_b16", 1, "--batch 16 --device cuda");
    return r;
  }
};

}  // namespace

TEST_F(CudaTrainGptParallel, BucketAndNaiveDataParallelMatchOneGpu) {
  expect_same_run(train("gpu_bucket_dp2", 2, kGpu + "--dp 2 --batch 8"), one_gpu(), "gpu --dp 2 bucket");
  expect_same_run(train("gpu_naive_dp2", 2, kGpu + "--dp 2 --dp-mode naive --batch 8"), one_gpu(), "gpu --dp 2 naive");
  expect_same_run(train("gpu_bucket_dp4", 4, kGpu + "--dp 4 --batch 4 --bucket-mb 0.01"), one_gpu(),
                  "gpu --dp 4 bucket (tiny buckets)");
  expect_same_run(train("gpu_dp2_accum", 2, kGpu + "--dp 2 --batch 4 --grad-accum 2"), one_gpu(),
                  "gpu --dp 2 --grad-accum 2");
}

TEST_F(CudaTrainGptParallel, PipelineAfab1F1BAndDataTimesPipelineMatchOneGpu) {
  expect_same_run(train("gpu_pp2_afab", 2, kGpu + "--pp 2 --microbatches 4 --batch 4 --schedule afab"), one_gpu(),
                  "gpu --pp 2 afab");
  expect_same_run(train("gpu_pp2_1f1b", 2, kGpu + "--pp 2 --microbatches 4 --batch 4 --schedule 1f1b"), one_gpu(),
                  "gpu --pp 2 1f1b");
  expect_same_run(train("gpu_dp2_pp2", 4, kGpu + "--dp 2 --pp 2 --microbatches 2 --batch 4"), one_gpu(),
                  "gpu --dp 2 --pp 2");
}

// dp 3 does not divide 16 sequences: against one GPU on 12. Tiny buckets cut
// params across shards.
TEST_F(CudaTrainGptParallel, ZeroMatchesOneGpu) {
  expect_same_run(train("gpu_zero_dp2", 2, kGpu + "--dp 2 --batch 8 --zero"), one_gpu(), "gpu --dp 2 --zero");
  const Result one_b12 = train("gpu_single_b12", 1, "--batch 12 --device cuda");
  expect_same_run(train("gpu_zero_dp3", 3, kGpu + "--dp 3 --batch 4 --zero --bucket-mb 0.01"), one_b12,
                  "gpu --dp 3 --zero (tiny buckets)");
}

// bf16 with the distributed optimizer, and fp16 with an inf forced into rank
// 0's gradient at step 3: found_inf reduced over the world makes every rank
// skip that step, as the one-GPU run does. Tolerances as the CPU's fp16 test
// (test_train_gpt_parallel.cpp's expect_overflow_skipped_everywhere).
TEST_F(CudaTrainGptParallel, SixteenBitAndAForcedOverflowMatchOneGpu) {
  const Result bf16_one = train("gpu_bf16_1", 1, "--batch 16 --device cuda --dtype bf16");
  expect_same_run(train("gpu_bf16_zero_dp2", 2, kGpu + "--dp 2 --batch 8 --zero --dtype bf16"), bf16_one,
                  "gpu bf16 --dp 2 --zero", 1e-3, 5e-2, 1e-2);
  const std::string inject = " --dtype fp16 --inject-overflow 3";
  const Result fp16_one = train("gpu_fp16_1", 1, "--batch 16 --device cuda" + inject);
  const Result par =
      train("gpu_fp16_dp2_pp2", 4, kGpu + "--dp 2 --pp 2 --microbatches 2 --batch 4 --zero --bucket-mb 0.01" + inject);
  ASSERT_EQ(par.status, 0) << par.output;
  ASSERT_EQ(par.log.size(), 10u);
  for (size_t i = 0; i < 10; ++i)
    EXPECT_EQ(par.log[i].find("\"skipped\": true") != std::string::npos, i == 3) << par.log[i];
  expect_same_run(par, fp16_one, "gpu fp16 overflow, dp 2 x pp 2 --zero", 1e-4, 1e-2, 1e-3);
}

// --experts under dp and ep on GPU tensors (tests/test_train_gpt_expert_parallel.cpp's runs): each rank
// routes its micro-batch of 4 as one GPU routes its 2 accumulated ones; the tokens travel by
// all_to_all_v, staged through the host here, by NCCL's grouped send/recv in the next test.
namespace {
const std::string kExperts = moe::kMoE + moe::kRouting;
const Result& one_gpu_experts() {
  static Result r = train("gpu_moe_ref", 1, kExperts + "--grad-accum 2 --device cuda");
  return r;
}
}  // namespace

TEST_F(CudaTrainGptParallel, ExpertsUnderDataAndExpertParallelMatchOneGpu) {
  for (const std::string parallel : {"--dp 2", "--dp 2 --ep 2", "--dp 2 --ep 2 --zero 1"}) {
    const Result got = train("gpu_moe_mpi", 2, kGpu + kExperts + parallel);
    expect_same_run(got, one_gpu_experts(), parallel.c_str());
    moe::expect_same_routing_log(got, one_gpu_experts(), parallel);
  }
}

TEST_F(CudaTrainGptParallel, ExpertParallelOverNcclMatchesOneGpu) {
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs (NCCL refuses two ranks on one GPU)";
  const Result got = train("gpu_moe_nccl", 2, " --device cuda " + kExperts + "--dp 2 --ep 2");
  expect_same_run(got, one_gpu_experts(), "--dp 2 --ep 2 over NCCL");
  moe::expect_same_routing_log(got, one_gpu_experts(), "--dp 2 --ep 2 over NCCL");
}

// Each rank says which GPU it took: a bare --device cuda is local rank mod
// the GPU count (one GPU here: every rank on cuda:0).
TEST_F(CudaTrainGptParallel, EachRankPrintsItsDevice) {
  const Result r = train("gpu_devices", 2, kGpu + "--dp 2 --batch 8");
  ASSERT_EQ(r.status, 0) << r.output;
  const int n = cuda::device_count();
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_NE(r.output.find("rank " + std::to_string(rank) + ": cuda:" + std::to_string(rank % n)), std::string::npos)
        << r.output;
}

// --trace on a GPU adds each rank's GPU tracks (parallel/trace/trace.h). Two
// ranks share the GPU over MPI: on the GPU compute stream (tid 3) every host
// forward and backward has its twin, with a positive length, in stream order
// (a step's forward ends before its backward begins), and ending no earlier
// than the host began launching it.
TEST_F(CudaTrainGptParallel, TraceShowsTheGpuComputeStream) {
  const fs::path path = work_dir() / "gpu_trace.json";
  const Result r = train("gpu_traced", 2, kGpu + "--dp 2 --batch 8 --trace " + path.string());
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json trace = read_trace(path);
  EXPECT_NE(trace.dump().find("GPU compute stream"), std::string::npos);
  for (int rank = 0; rank < 2; ++rank) {
    const auto host_b = spans_on(trace, rank, 0, "backward"), gpu_f = spans_on(trace, rank, 3, "forward"),
               gpu_b = spans_on(trace, rank, 3, "backward");
    ASSERT_FALSE(host_b.empty()) << "rank " << rank;
    ASSERT_EQ(gpu_b.size(), host_b.size()) << "rank " << rank;
    ASSERT_EQ(gpu_f.size(), gpu_b.size()) << "rank " << rank;
    for (size_t i = 0; i < gpu_b.size(); ++i) {
      EXPECT_GT(gpu_b[i].end, gpu_b[i].begin) << "rank " << rank << " step " << i;
      EXPECT_LE(gpu_f[i].end, gpu_b[i].begin) << "rank " << rank << " step " << i;
      EXPECT_GE(gpu_b[i].end, host_b[i].begin) << "rank " << rank << " step " << i;
    }
  }
}

// The default backend on GPUs: NCCL for the GPU tensors (buckets, ZeRO's
// shards, the pipeline's activations and gradients), MPI for host scalars
// and the pipeline's shape headers (parallel/comm/process_group_by_device.h).
// NCCL refuses two ranks on one GPU, so these need two, and four.
TEST_F(CudaTrainGptParallel, DataParallelZeroAndPipelineOverNcclMatchOneGpu) {
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs (NCCL refuses two ranks on one GPU)";
  expect_same_run(train("gpu_nccl_dp2", 2, "--device cuda --dp 2 --batch 8"), one_gpu(), "gpu --dp 2 over NCCL");
  expect_same_run(train("gpu_nccl_zero_dp2", 2, "--device cuda --dp 2 --batch 8 --zero --bucket-mb 0.01"), one_gpu(),
                  "gpu --dp 2 --zero over NCCL (tiny buckets)");
  expect_same_run(train("gpu_nccl_pp2_afab", 2, "--device cuda --pp 2 --microbatches 4 --batch 4 --schedule afab"),
                  one_gpu(), "gpu --pp 2 afab over NCCL");
  expect_same_run(train("gpu_nccl_pp2_1f1b", 2, "--device cuda --pp 2 --microbatches 4 --batch 4 --schedule 1f1b"),
                  one_gpu(), "gpu --pp 2 1f1b over NCCL");
  // The trace: small buckets' all-reduces on the GPU communication stream
  // (tid 4), the first of a step starting before that step's GPU backward ends.
  const fs::path path = work_dir() / "gpu_nccl_trace.json";
  const Result traced = train("gpu_nccl_traced", 2, "--device cuda --dp 2 --batch 8 --bucket-mb 0.01 --trace " +
                              path.string());
  ASSERT_EQ(traced.status, 0) << traced.output;
  const nlohmann::json trace = read_trace(path);
  for (int rank = 0; rank < 2; ++rank) {
    const auto backward = spans_on(trace, rank, 3, "backward");
    std::vector<TraceSpan> reduces;
    for (const TraceSpan& s : spans_on(trace, rank, 4))
      if (s.name.find("all_reduce") != std::string::npos) reduces.push_back(s);
    ASSERT_FALSE(backward.empty()) << "rank " << rank;
    ASSERT_FALSE(reduces.empty()) << "rank " << rank;
    bool overlapped = false;
    for (const TraceSpan& b : backward)
      for (const TraceSpan& c : reduces) overlapped |= c.begin > b.begin && c.begin < b.end;
    EXPECT_TRUE(overlapped) << "rank " << rank << ": no all-reduce began during a GPU backward";
  }
  if (cuda::device_count() < 4) return;  // dp x pp needs a GPU per rank
  expect_same_run(train("gpu_nccl_dp2_pp2", 4, "--device cuda --dp 2 --pp 2 --microbatches 2 --batch 4 --zero"),
                  one_gpu(), "gpu --dp 2 --pp 2 --zero over NCCL");
}
