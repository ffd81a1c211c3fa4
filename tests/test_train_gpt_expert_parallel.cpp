// train_gpt --experts across ranks, each configuration against one process
// through tests/train_gpt_run.h's helpers.
//
// What one process a run must equal: each rank routes its own micro-batch (the
// capacity ceil(F N k / E) counts its N tokens, the aux loss E Σ_e f_e P_e is
// over its tokens), as Megatron does. So dp 2 with --batch 4 equals one process
// with --batch 4 --grad-accum 2 - the same four-sequence micro-batches - with
// every routing option on; against --batch 8 only dropless routing without an
// aux loss is the same (tests/test_train_gpt_moe.cpp shows that one).
// DeepSeek-V3's bias moves by the step's load over every replica
// (parallel/expert_parallel/routing_sync.h).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "moe_runs.h"
#include "train_gpt_run.h"

using namespace loom;
using namespace loom::test;
using namespace loom::test::moe;

namespace {

// One process, the micro-batches of 2 ranks one after the other.
const Result& one_process_two_micro_batches() {
  static const Result r = train("ep_ref_k2", 1, kMoE + kRouting + "--grad-accum 2");
  return r;
}

}  // namespace

// Without --ep the experts are replicated like every other weight; their gradients all-reduced with the rest.
TEST(TrainGptExpertParallel, DataParallelEqualsOneProcessWithEveryRoutingOption) {
  const Result& ref = one_process_two_micro_batches();
  expect_same_run(train("ep_dp2_bucket", 2, kMoE + kRouting + "--dp 2"), ref, "--dp 2 (bucket)");
  expect_same_run(train("ep_dp2_naive", 2, kMoE + kRouting + "--dp 2 --dp-mode naive"), ref, "--dp 2 --dp-mode naive");
}

TEST(TrainGptExpertParallel, ZeroOneAndTwoEqualOneProcess) {
  const Result& ref = one_process_two_micro_batches();
  expect_same_run(train("ep_dp2_zero1", 2, kMoE + kRouting + "--dp 2 --zero 1"), ref, "--dp 2 --zero 1");
  expect_same_run(train("ep_dp2_zero2", 2, kMoE + kRouting + "--dp 2 --zero 2"), ref, "--dp 2 --zero 2");
}

// The log's routing numbers are the step's over every replica: the same as one process's.
TEST(TrainGptExpertParallel, DataParallelLogsTheRoutingOfEveryReplica) {
  const Result& ref = one_process_two_micro_batches();
  const Result dp = train("ep_dp2_log", 2, kMoE + kRouting + "--dp 2", false);
  ASSERT_EQ(dp.status, 0) << dp.output;
  expect_same_routing_log(dp, ref, "--dp 2");
}

namespace {

// Under --ep each rank holds its own experts: the model file gathers them all, and one process (2
// micro-batches) finds each expert's optimizer state in the shard of the ep rank that held it.
void expect_save_resumes(const std::string& name, const std::string& parallel) {
  moe::expect_save_resumes(name, kMoE + "--shared-experts 1 --capacity-factor 1.0 --router-aux-loss-coef 0.05 ",
                           parallel, "--grad-accum 2");
}

}  // namespace

TEST(TrainGptExpertParallel, DataParallelSaveResumesAtDataParallelAndAtOneProcess) {
  expect_save_resumes("ep_dp2", "--dp 2");
}

// ---- expert parallelism: --ep N, the experts' compute split over N consecutive dp ranks ----

namespace {

// One process, the micro-batches of `ranks` ranks one after the other.
Result one_process(const std::string& name, int micro_batches, const std::string& flags) {
  return train(name, 1, flags + "--grad-accum " + std::to_string(micro_batches));
}

}  // namespace

TEST(TrainGptExpertParallel, EpTwoEqualsOneProcessWithEveryRoutingOption) {
  expect_same_run(train("ep2", 2, kMoE + kRouting + "--dp 2 --ep 2"), one_process_two_micro_batches(),
                  "--dp 2 --ep 2");
}

// Naive DP and one bucket per tensor all-reduce in the order backward reaches the weights: every rank of
// an expert-dp group must reach its experts' in the same order, and every dp rank the rest.
TEST(TrainGptExpertParallel, EpUnderNaiveAndPerTensorBucketsEqualsOneProcess) {
  const Result ref = one_process("ep4_ref_plain", 4, kMoE);
  // ep 2 of dp 4: the experts' reductions run over expert-dp groups of 2, beside dp's.
  expect_same_run(train("ep4_naive", 4, kMoE + "--dp 4 --ep 2 --dp-mode naive"), ref, "--dp 4 --ep 2 --dp-mode naive");
  expect_same_run(train("ep4_buckets", 4, kMoE + "--dp 4 --ep 2 --bucket-mb 0.001"), ref,
                  "--dp 4 --ep 2 --bucket-mb 0.001");
}

TEST(TrainGptExpertParallel, EpFourEqualsOneProcess) {
  const Result ref = one_process("ep4_ref", 4, kMoE + kRouting);
  expect_same_run(train("ep4", 4, kMoE + kRouting + "--dp 4 --ep 4"), ref, "--dp 4 --ep 4");
  // ep 2 inside dp 4: two ep groups {0,1} {2,3}, each expert held by two ranks, its gradients averaged over
  // them (expert-dp groups {0,2} {1,3}) and scaled by 1 / ep.
  expect_same_run(train("ep2_dp4", 4, kMoE + kRouting + "--dp 4 --ep 2"), ref, "--dp 4 --ep 2");
}

// ZeRO-1/2 shard the rest over dp and the experts over their expert-dp group (of one rank at dp 2 ep 2;
// dp 4 ep 2 in tests/test_train_gpt_expert_zero.cpp), each element counted once in the grad norm.
TEST(TrainGptExpertParallel, EpWithZeroOneAndTwoEqualsOneProcess) {
  expect_same_run(train("ep2_zero1", 2, kMoE + kRouting + "--dp 2 --ep 2 --zero 1"), one_process_two_micro_batches(),
                  "--dp 2 --ep 2 --zero 1");
  const Result ref = one_process("ep4_zero_ref", 4, kMoE + kRouting);
  expect_same_run(train("ep2_dp4_zero2", 4, kMoE + kRouting + "--dp 4 --ep 2 --zero 2 --overlap-param-gather"), ref,
                  "--dp 4 --ep 2 --zero 2 --overlap-param-gather");
}

// Each ep rank writes its own experts' optimizer state under their global names (and a copy of the
// replicated state): ep 2 resumes at ep 2 bit-exactly and at one process (all experts) within rounding.
TEST(TrainGptExpertParallel, EpSaveResumesAtEpAndAtOneProcess) {
  expect_save_resumes("ep2", "--dp 2 --ep 2");
  expect_save_resumes("ep2_zero1", "--dp 2 --ep 2 --zero 1");  // the rest sharded, the experts over expert-dp
}

// And back: one process's checkpoint (every expert) resumes at ep 2, each rank cutting out its experts.
TEST(TrainGptExpertParallel, OneProcessSaveResumesAtEpTwo) {
  const std::string flags = kMoE + "--shared-experts 1 --router-aux-loss-coef 0.05 ";
  const Result straight = train("ep1_to_ep2_straight", 1, flags + "--grad-accum 2");
  const Result first = train("ep1_to_ep2_first", 1, flags + "--grad-accum 2 --stop-at 5");
  ASSERT_EQ(first.status, 0) << first.output;
  const Result ep = train("ep1_to_ep2_resumed", 2, flags + "--dp 2 --ep 2 --resume " + checkpoint("ep1_to_ep2_first"));
  ASSERT_EQ(straight.status, 0) << straight.output;
  ASSERT_EQ(ep.status, 0) << ep.output;
  ASSERT_EQ(ep.losses.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_NEAR(ep.losses[i], straight.losses[5 + i], 1e-5 * straight.losses[5 + i]) << "step " << 5 + i;
    EXPECT_NEAR(ep.grad_norms[i], straight.grad_norms[5 + i], 1e-5 * straight.grad_norms[5 + i]) << "step " << 5 + i;
  }
  ASSERT_EQ(ep.weights.tensors.size(), straight.weights.tensors.size());
  for (const auto& [tensor, t] : straight.weights.tensors) {
    const Diff d = diff_of(ep.weights.at(tensor), t);
    EXPECT_LE(d.l2_diff, 1e-5 * d.l2_ref) << tensor;
  }
}

// --export-hf at ep 2 writes every expert (Mixtral's names), as one process's export does.
TEST(TrainGptExpertParallel, EpExportEqualsOneProcessExport) {
  const std::string flags = kMoE + "--capacity-factor 1.0 --router-aux-loss-coef 0.05 ";
  const Result ep = train_and_export("ep2_export", 2, flags + "--dp 2 --ep 2");
  const Result one = train_and_export("ep2_export_1", 1, flags + "--grad-accum 2");
  ASSERT_EQ(ep.status, 0) << ep.output;
  ASSERT_EQ(one.status, 0) << one.output;
  ASSERT_EQ(ep.weights.tensors.size(), one.weights.tensors.size());
  bool has_every_expert = false;
  for (const auto& [name, t] : ep.weights.tensors) has_every_expert |= name == "model.layers.1.block_sparse_moe.experts.3.w2.weight";
  for (const auto& [name, t] : one.weights.tensors) {
    const Diff d = diff_of(ep.weights.at(name), t);
    EXPECT_LE(d.l2_diff, 1e-5 * d.l2_ref) << name;
  }
  EXPECT_TRUE(has_every_expert);
}

// --trace: each layer's dispatch hands over the rows this rank routed, N k rows of C floats (dropless:
// 4 x 16 tokens x 2 x 32 x 4 bytes = 16384), and each combine the rows its experts computed; over the two
// ranks a layer's combines move what its dispatches moved. Before each dispatch, the split sizes: an
// [ep, E / ep] int64 table, 2 x 2 x 8 = 32 bytes.
TEST(TrainGptExpertParallel, TraceShowsDispatchAndCombineWithTheirBytes) {
  const fs::path path = work_dir() / "ep_trace.json";
  const Result r = train("ep2_trace", 2, kMoE + "--dp 2 --ep 2 --trace " + path.string(), false);
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream f(path);
  const nlohmann::json trace = nlohmann::json::parse(f);
  std::map<int, std::map<std::string, std::vector<int64_t>>> bytes;  // rank -> "for" -> each all-to-all's bytes
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X" || e["tid"] != 1 || e["name"].get<std::string>().rfind("all_to_all_v", 0) != 0) continue;
    const std::string what = e.contains("args") ? e["args"].value("for", std::string()) : "";
    bytes[e["pid"].get<int>()][what].push_back(e["args"].value("bytes", int64_t(-1)));
  }
  const int64_t N = 4 * 16, k = 2, C = 32, layers = 2, steps = 10;
  ASSERT_EQ(bytes.size(), 2u);
  for (auto& [rank, by_what] : bytes) {
    ASSERT_EQ(by_what["moe dispatch"].size(), size_t(layers * steps)) << "rank " << rank;
    ASSERT_EQ(by_what["moe combine"].size(), size_t(layers * steps)) << "rank " << rank;
    for (int64_t b : by_what["moe dispatch"]) EXPECT_EQ(b, N * k * C * 4) << "rank " << rank;
    // unlabelled: the split sizes (forward), and backward's two reverse all-to-alls
    int64_t splits = 0;
    for (int64_t b : by_what[""]) splits += b == 2 * 2 * 8;
    EXPECT_EQ(splits, layers * steps) << "rank " << rank;
  }
  for (size_t i = 0; i < size_t(layers * steps); ++i)
    EXPECT_EQ(bytes[0]["moe combine"][i] + bytes[1]["moe combine"][i], 2 * N * k * C * 4) << "layer-step " << i;
}

TEST(TrainGptExpertParallel, WhatEpCannotMeanOrDoesNotComposeWithYetIsRefusedBeforeTraining) {
  const std::pair<std::string, std::string> cases[] = {
      {"--arch llama --ep 2 --dp 2", "--ep tunes a mixture of experts; it needs --experts E"},
      {kMoE + "--dp 3 --ep 3", "--ep 3 does not divide --experts 4"},
      {kMoE + "--dp 2 --ep 4", "--ep 4 does not divide --dp 2: the ep group is ep consecutive data-parallel ranks"},
      {kMoE + "--dp 2 --ep 2 --zero 3 --dp-shard 1",
       "--ep 2 with --dp-shard 1: the ep group is ep consecutive ranks of one shard group"}};
  for (const auto& [flags, want] : cases) {
    const int ranks = flags.find("--dp 3") != std::string::npos ? 3 : 2;
    const Result r = train("ep_refused", ranks, flags, false);
    EXPECT_NE(r.status, 0) << flags;
    EXPECT_NE(r.output.find(want), std::string::npos) << flags << "\n" << r.output;
    EXPECT_EQ(r.output.find("| loss "), std::string::npos) << flags << ": trained before refusing\n" << r.output;
  }
}
