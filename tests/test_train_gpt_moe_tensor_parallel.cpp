// train_gpt --experts under tensor parallelism (with and without sequence
// parallelism) and context parallelism, each against one process on the same
// global batch, through tests/train_gpt_run.h's helpers.
//
// tp ranks hold one micro-batch between them, so the reference is one process
// with the same --batch. Under plain tp every tp rank routes every token: the
// router and the experts are replicated, their gradients equal on each rank,
// and every routing option (capacity too) is one process's. Under
// --sequence-parallel and --cp each rank routes its own tokens: the aux loss's
// f_e and the loads are summed over the ranks holding the micro-batch
// (parallel/moe_token_shards.h), which makes the aux loss, the z-loss and
// DeepSeek's bias one process's; capacity is refused there.
#include <gtest/gtest.h>

#include "moe_runs.h"
#include "train_gpt_run.h"

using namespace loom;
using namespace loom::test;
using namespace loom::test::moe;

namespace {

const Result& one_process_every_option() {
  static const Result r = train("moetp_ref", 1, kMoE + kRouting);
  return r;
}
const Result& one_process_dropless() {
  static const Result r = train("moetp_ref_dropless", 1, kMoE + kDropless);
  return r;
}

}  // namespace

TEST(TrainGptMoETensorParallel, TpTwoEqualsOneProcessWithEveryRoutingOption) {
  const Result tp = train("moetp_tp2", 2, kMoE + kRouting + "--tp 2");
  expect_same_run(tp, one_process_every_option(), "--tp 2");
  expect_same_routing_log(tp, one_process_every_option(), "--tp 2");
}

TEST(TrainGptMoETensorParallel, SequenceParallelEqualsOneProcessDropless) {
  const Result sp = train("moetp_sp2", 2, kMoE + kDropless + "--tp 2 --sequence-parallel");
  expect_same_run(sp, one_process_dropless(), "--tp 2 --sequence-parallel");
  expect_same_routing_log(sp, one_process_dropless(), "--tp 2 --sequence-parallel");
}

TEST(TrainGptMoETensorParallel, ContextParallelEqualsOneProcessDropless) {
  const Result cp = train("moetp_cp2", 2, kMoE + kDropless + "--cp 2");
  expect_same_run(cp, one_process_dropless(), "--cp 2");
  expect_same_routing_log(cp, one_process_dropless(), "--cp 2");
}

// Four ranks: the token shards over tp and cp at once; and tp beside data parallel.
TEST(TrainGptMoETensorParallel, TpWithCpAndWithDpEqualOneProcess) {
  expect_same_run(train("moetp_sp2_cp2", 4, kMoE + kDropless + "--tp 2 --sequence-parallel --cp 2"),
                  one_process_dropless(), "--tp 2 --sequence-parallel --cp 2");
  const Result ref = train("moetp_ref_k2", 1, kMoE + kRouting + "--grad-accum 2");
  expect_same_run(train("moetp_tp2_dp2", 4, kMoE + kRouting + "--tp 2 --dp 2"), ref, "--tp 2 --dp 2");
}

// --ep 2 inside dp 2 on each cp rank: the ep group is carved from the dp group, so the ranks of one ep group
// hold the same cp coordinate and dispatch the tokens that coordinate holds; each expert's gradient is summed
// over its expert-dp group with its cp ranks. (--ep with tp: tests/test_train_gpt_expert_grid.cpp.)
TEST(TrainGptMoETensorParallel, CpWithExpertParallelEqualsOneProcess) {
  const Result dropless = train("moetp_ref_dropless_k2", 1, kMoE + kDropless + "--grad-accum 2");
  expect_same_run(train("moetp_cp2_ep2", 4, kMoE + kDropless + "--cp 2 --dp 2 --ep 2"), dropless,
                  "--cp 2 --dp 2 --ep 2");
}

TEST(TrainGptMoETensorParallel, TpSaveResumesAtTpAndAtOneProcess) {
  expect_save_resumes("moetp_tp2", kMoE + kRouting, "--tp 2", "");
}

TEST(TrainGptMoETensorParallel, SequenceParallelSaveResumesAtTpAndAtOneProcess) {
  expect_save_resumes("moetp_sp2", kMoE + kDropless, "--tp 2 --sequence-parallel", "");
}

// --export-hf at tp 2 writes Mixtral's names, every expert whole, as one process's export does.
TEST(TrainGptMoETensorParallel, TpExportEqualsOneProcessExport) {
  const std::string flags = kMoE + "--capacity-factor 1.0 --router-aux-loss-coef 0.05 ";
  const Result tp = train_and_export("moetp_export", 2, flags + "--tp 2");
  const Result one = train_and_export("moetp_export_1", 1, flags);
  ASSERT_EQ(tp.status, 0) << tp.output;
  ASSERT_EQ(one.status, 0) << one.output;
  ASSERT_EQ(tp.weights.tensors.size(), one.weights.tensors.size());
  bool has_every_expert = false;
  for (const auto& [name, t] : tp.weights.tensors)
    has_every_expert |= name == "model.layers.1.block_sparse_moe.experts.3.w2.weight";
  EXPECT_TRUE(has_every_expert);
  for (const auto& [name, t] : one.weights.tensors) {
    const Diff d = diff_of(tp.weights.at(name), t);
    EXPECT_LE(d.l2_diff, 1e-5 * d.l2_ref) << name;
  }
}

TEST(TrainGptMoETensorParallel, WhatDoesNotComposeYetIsRefusedBeforeTraining) {
  const std::pair<std::string, std::string> cases[] = {
      {kMoE + "--tp 2 --sequence-parallel --capacity-factor 1.0",
       "--capacity-factor 1 with --tp 2 --sequence-parallel: the micro-batch's tokens are split over ranks"},
      {kMoE + "--cp 2 --capacity-factor 1.0", "--capacity-factor 1 with --cp 2: the micro-batch's tokens are split"}};
  for (const auto& [flags, want] : cases) {
    const Result r = train("moetp_refused", 2, flags, false);
    EXPECT_NE(r.status, 0) << flags;
    EXPECT_NE(r.output.find(want), std::string::npos) << flags << "\n" << r.output;
    EXPECT_EQ(r.output.find("| loss "), std::string::npos) << flags << ": trained before refusing\n" << r.output;
  }
}
