// train_gpt --experts under pipeline parallel (every schedule, pp x dp x ep),
// recomputation and ZeRO-3 (issue 45), each against one process through
// tests/train_gpt_run.h's helpers.
//
// What must hold for the pipeline to equal one process:
//   the aux losses   each MoE layer's aux loss is seeded where its block runs,
//                    on whichever stage holds it (nn/moe_aux_loss.h's
//                    attach_aux_loss rides the stage's backward), scaled by
//                    1 / micro-batches as the main loss is, not on the last stage only
//   the bias         each stage moves its layers' biases by their load summed
//                    over the step's micro-batches, then over dp
//   the checkpoint   each stage's biases gathered into the one model file
//   the log          the routing summed over dp, then over the stages
// One process runs the same micro-batches: --batch 4 --grad-accum 2 against
// --pp 2 --microbatches 2 (capacity and aux loss are per micro-batch).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "moe_runs.h"
#include "train_gpt_run.h"

using namespace loom;
using namespace loom::test;
using namespace loom::test::moe;

namespace {

// One process, two micro-batches of 4 sequences one after the other.
const Result& one_process_two_micro_batches() {
  static const Result r = train("moepp_ref_k2", 1, kMoE + kRouting + "--grad-accum 2");
  return r;
}

}  // namespace

// Two stages: block 0 (and its aux loss) on stage 0, block 1 and the loss on stage 1.
TEST(TrainGptMoEPipeline, OneFOneBAndAfabEqualOneProcessWithEveryRoutingOption) {
  const Result& ref = one_process_two_micro_batches();
  for (const std::string schedule : {"1f1b", "afab"}) {
    const Result pp = train("moepp_pp2_" + schedule, 2, kMoE + kRouting + "--pp 2 --microbatches 2 --schedule " +
                                                            schedule);
    expect_same_run(pp, ref, ("--pp 2 --schedule " + schedule).c_str());
    expect_same_routing_log(pp, ref, "--pp 2 --schedule " + schedule);
  }
}

// pp 4 over [embedding, block 0, block 1, head]: the first and last stages hold no experts (their
// routing log adds zeros), the middle two one MoE block each.
TEST(TrainGptMoEPipeline, FourStagesEqualOneProcess) {
  const Result& ref = one_process_two_micro_batches();
  const Result pp = train("moepp_pp4", 4, kMoE + kRouting + "--pp 4 --microbatches 2");
  expect_same_run(pp, ref, "--pp 4");
  expect_same_routing_log(pp, ref, "--pp 4");
}

// B/W split (zb-h1, zb-v, dualpipev): the experts' linears are separable like any other (their dW runs in
// W), the gate's gradient comes through the router's softmax and is computed in B, held for W.
TEST(TrainGptMoEPipeline, ZeroBubbleSchedulesEqualOneProcess) {
  const Result& ref = one_process_two_micro_batches();
  expect_same_run(train("moepp_zbh1", 2, kMoE + kRouting + "--pp 2 --microbatches 2 --schedule zb-h1"), ref,
                  "--pp 2 --schedule zb-h1");
  expect_same_run(train("moepp_zbv", 2, kMoE + kRouting + "--pp 2 --microbatches 2 --schedule zb-v "
                                                         "--virtual-stages 2"), ref, "--pp 2 --schedule zb-v");
  // dualpipev needs 2 pp micro-batches: 4 of 2 sequences, as one process accumulating 4.
  const std::string small = " --arch llama --experts 4 --experts-per-token 2 --batch 2 " + kRouting;
  expect_same_run(train("moepp_dualpipev", 2, small + "--pp 2 --microbatches 4 --schedule dualpipev "
                                                      "--virtual-stages 2"),
                  train("moepp_ref_k4", 1, small + "--grad-accum 4"), "--pp 2 --schedule dualpipev");
}

// dp 2 x pp 2: each stage's biases move by the load over both replicas' micro-batches. (--ep under a
// pipeline: tests/test_train_gpt_expert_grid.cpp.)
TEST(TrainGptMoEPipeline, DataParallelAtEachStageEqualsOneProcess) {
  const Result& ref = one_process_two_micro_batches();
  const Result dp = train("moepp_dp2_pp2", 4, kMoE + kRouting + "--dp 2 --pp 2 --microbatches 1");
  expect_same_run(dp, ref, "--dp 2 --pp 2");
  expect_same_routing_log(dp, ref, "--dp 2 --pp 2");
}

// Saved at step 5 by two stages (each stage's biases gathered into the model file), resumed by two
// stages: the same bits as straight through; resumed by one process: within tolerance.
TEST(TrainGptMoEPipeline, SaveResumesBitExactAndAtOneProcess) {
  Result first;
  expect_save_resumes("moepp", kMoE + kRouting, "--pp 2 --microbatches 2", "--grad-accum 2", &first);
  if (HasFatalFailure()) return;
  // Both stages' biases are in the file, and moved: block 1's lives on stage 1.
  for (const std::string name : {"blocks.0.moe.score_bias", "blocks.1.moe.score_bias"}) {
    ASSERT_TRUE(first.weights.contains(name)) << name;
    const std::vector<float> b = first.weights.at(name).to_vector<float>();
    EXPECT_GT(*std::max_element(b.begin(), b.end()) - *std::min_element(b.begin(), b.end()), 0.015f) << name;
  }
}

// --export-hf from two stages writes every layer's experts (Mixtral's names), as one process does.
// (No bias: Mixtral routes without one, so its export is refused.)
TEST(TrainGptMoEPipeline, ExportEqualsOneProcessExport) {
  const std::string flags = kMoE + "--capacity-factor 1.0 --router-aux-loss-coef 0.05 ";
  const Result pp = train_and_export("moepp_export", 2, flags + "--pp 2 --microbatches 2");
  const Result one = train_and_export("moepp_export_1", 1, flags + "--grad-accum 2");
  ASSERT_EQ(pp.status, 0) << pp.output;
  ASSERT_EQ(one.status, 0) << one.output;
  ASSERT_EQ(pp.weights.tensors.size(), one.weights.tensors.size());
  EXPECT_TRUE(pp.weights.contains("model.layers.1.block_sparse_moe.experts.3.w2.weight"));
  for (const auto& [name, t] : one.weights.tensors) {
    const Diff d = diff_of(pp.weights.at(name), t);
    EXPECT_LE(d.l2_diff, 1e-5 * d.l2_ref) << name;
  }
}

// ---- recomputation: the rerun routes as the forward did ----

// The rerun (in backward) routes with the same gate weights and the same bias - both move only at the
// optimizer step, after backward - so it picks the same experts and drops the same slots; it counts the
// routing once (the first run, under no grad, counts nothing). So recomputation changes no bit.
TEST(TrainGptMoERecompute, SelectiveAndFullAreBitIdenticalToNone) {
  const std::string flags = kMoE + kRouting + "--dropout 0.1";  // dropout: the MoE layer's masks drawn again too
  const Result none = train("moerc_none", 1, flags);
  for (const std::string mode : {"selective", "full"}) {
    const Result got = train("moerc_" + mode, 1, flags + " --recompute " + mode);
    expect_bit_identical(got, none, "--recompute " + mode, "--recompute none");
    for (size_t i = 0; i < none.log.size() && i < got.log.size(); ++i)  // the routing: the same numbers
      EXPECT_EQ(got.log[i].substr(got.log[i].find("\"moe_balance\"")),
                none.log[i].substr(none.log[i].find("\"moe_balance\"")))
          << "--recompute " << mode << " step " << i;
  }
  const std::string pp = kMoE + kRouting + "--pp 2 --microbatches 2";
  expect_bit_identical(train("moerc_pp2_full", 2, pp + " --recompute full"), train("moerc_pp2_none", 2, pp),
                       "--pp 2 --recompute full", "--pp 2");
}

// Under --ep the rerun runs the dispatch and combine all-to-alls again (parallel/recompute.cpp says why
// rather than keeping the dispatched rows): every rank reaches them in the same order, so the run is
// the same bits as without recomputation, and the trace shows each layer's dispatch twice a step, with
// the same bytes (N k C 4 = 4 x 16 x 2 x 32 x 4, dropless).
TEST(TrainGptMoERecompute, UnderEpTheRerunDispatchesAgain) {
  const fs::path path = work_dir() / "moerc_ep_trace.json";
  const std::string flags = kMoE + "--dp 2 --ep 2 --router-aux-loss-coef 0.05 ";
  const Result none = train("moerc_ep_none", 2, flags);
  const Result full = train("moerc_ep_full", 2, flags + "--recompute full --trace " + path.string());
  expect_bit_identical(full, none, "--dp 2 --ep 2 --recompute full", "--recompute none");
  std::ifstream f(path);
  const nlohmann::json trace = nlohmann::json::parse(f);
  std::map<int, std::vector<int64_t>> dispatches;  // rank -> each dispatch's bytes
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X" && e["tid"] == 1 && e["name"].get<std::string>().rfind("all_to_all_v", 0) == 0 &&
        e.contains("args") && e["args"].value("for", std::string()) == "moe dispatch")
      dispatches[e["pid"].get<int>()].push_back(e["args"].value("bytes", int64_t(-1)));
  const int64_t N = 4 * 16, k = 2, C = 32, layers = 2, steps = 10;
  ASSERT_EQ(dispatches.size(), 2u);
  for (const auto& [rank, bytes] : dispatches) {
    EXPECT_EQ(bytes.size(), size_t(2 * layers * steps)) << "rank " << rank << ": forward and rerun";
    for (int64_t b : bytes) EXPECT_EQ(b, N * k * C * 4) << "rank " << rank;
  }
}

// ---- ZeRO-3: the experts are params like any other, gathered with their block ----

TEST(TrainGptMoEZero3, EqualsOneProcessAloneAndUnderAPipeline) {
  const Result& ref = one_process_two_micro_batches();
  expect_same_run(train("moez3", 2, kMoE + kRouting + "--dp 2 --zero 3 --recompute full"), ref,
                  "--dp 2 --zero 3 --recompute full");
  expect_same_run(train("moez3_pp2", 4, kMoE + kRouting + "--dp 2 --zero 3 --pp 2 --microbatches 1"), ref,
                  "--dp 2 --zero 3 --pp 2");
}

TEST(TrainGptMoEPipeline, WhatIsNotTestedYetIsRefusedBeforeTraining) {
  const std::pair<std::string, std::string> cases[] = {
      {kMoE + "--dp 2 --ep 2 --zero 3 --dp-shard 1",
       "--ep 2 with --dp-shard 1: the ep group is ep consecutive ranks of one shard group"}};
  for (const auto& [flags, want] : cases) {
    const Result r = train("moepp_refused", 2, flags, false);
    EXPECT_NE(r.status, 0) << flags;
    EXPECT_NE(r.output.find(want), std::string::npos) << flags << "\n" << r.output;
    EXPECT_EQ(r.output.find("| loss "), std::string::npos) << flags << ": trained before refusing\n" << r.output;
  }
}
