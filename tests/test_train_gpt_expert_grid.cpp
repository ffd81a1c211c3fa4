// train_gpt --ep beside tensor and pipeline parallelism (issue 45: "ep x tp, ep x pp"), each
// configuration against one process through tests/train_gpt_run.h's helpers, 4 ranks each.
//
// Where ep sits (parallel/process_group_manager.h): the ep group is ep consecutive dp ranks of one
// (tp, cp, pp) coordinate, so under tp each tp rank has its own ep group (the routed experts are
// whole on every tp rank: tp rank r's ep group splits them over its dp ranks), and under pp the ranks
// of an ep group share a stage (the all-to-all runs inside the stage). The grad norm and found_inf
// sum over pp x tp x ep (ProcessGroupManager::ep_model_parallel_group): an expert's square counted
// once (on tp rank 0 of its ep rank), a tp-split param's summed over tp, the rest on ep rank 0 and tp
// rank 0 (finalize_model_grads.h's not_counted).
//
// The micro-batches: dp 2 with --batch 4 is one process's --batch 4 --grad-accum 2 (each rank routes
// its own micro-batch: tests/test_train_gpt_expert_parallel.cpp); under pp 2 with 2 micro-batches
// per replica, --grad-accum 4.
#include <gtest/gtest.h>

#include "moe_runs.h"
#include "train_gpt_run.h"

using namespace loom;
using namespace loom::test;
using namespace loom::test::moe;

namespace {

const Result& one_process_k2() {
  static const Result r = train("epgrid_ref_k2", 1, kMoE + kRouting + "--grad-accum 2");
  return r;
}
const Result& one_process_k2_dropless() {
  static const Result r = train("epgrid_ref_k2_dropless", 1, kMoE + kDropless + "--grad-accum 2");
  return r;
}
const Result& one_process_k4() {
  static const Result r = train("epgrid_ref_k4", 1, kMoE + kRouting + "--grad-accum 4");
  return r;
}

// Every run of the export tests: capacity and the aux loss (Mixtral exports neither bias nor shared experts).

// --export-hf of a 4-rank run equals one process's (Mixtral's names, every expert whole).

}  // namespace

// ---- ep x tp: tp 2 x dp 2, ep 2 (ep groups {0,2} {1,3}: one per tp rank) ----

// Plain tp: every tp rank routes every token of its micro-batch, so capacity and every option are one
// process's; each tp rank's ep group dispatches the same tokens.
TEST(TrainGptExpertGrid, TpTimesEpEqualsOneProcessWithEveryRoutingOption) {
  const Result r = train("epgrid_tp2_ep2", 4, kMoE + kRouting + "--tp 2 --dp 2 --ep 2");
  expect_same_run(r, one_process_k2(), "--tp 2 --dp 2 --ep 2");
  expect_same_routing_log(r, one_process_k2(), "--tp 2 --dp 2 --ep 2");
}

// Sequence parallel: each tp rank routes and dispatches its T / tp tokens; the experts' gradients are
// partial sums over tp, summed after backward (finalize_model_grads.h) and then over expert-dp.
TEST(TrainGptExpertGrid, SequenceParallelTimesEpEqualsOneProcessDropless) {
  const Result r = train("epgrid_sp2_ep2", 4, kMoE + kDropless + "--tp 2 --sequence-parallel --dp 2 --ep 2");
  expect_same_run(r, one_process_k2_dropless(), "--tp 2 --sequence-parallel --dp 2 --ep 2");
  expect_same_routing_log(r, one_process_k2_dropless(), "--tp 2 --sequence-parallel --dp 2 --ep 2");
}

// The model file gathers every expert and joins the tp shards; each ep rank's tp rank 0 writes its experts'
// optimizer state (joined over tp), found by name at tp 2 x ep 2 and at one process.
TEST(TrainGptExpertGrid, TpTimesEpSaveResumesThereAndAtOneProcess) {
  expect_save_resumes("epgrid_tp2_ep2", kMoE + kRouting, "--tp 2 --dp 2 --ep 2", "--grad-accum 2", nullptr, 4);
  expect_save_resumes("epgrid_sp2_ep2", kMoE + kDropless, "--tp 2 --sequence-parallel --dp 2 --ep 2",
                      "--grad-accum 2", nullptr, 4);
}

TEST(TrainGptExpertGrid, TpTimesEpExportEqualsOneProcessExport) {
  expect_export_equals_one_process("epgrid_tp2_ep2_export", 4, "--tp 2 --dp 2 --ep 2", "--grad-accum 2");
}

// ---- ep x pp: pp 2 x dp 2, ep 2 (ep groups {0,1} on stage 0, {2,3} on stage 1), 2 micro-batches ----

TEST(TrainGptExpertGrid, PipelineTimesEpEqualsOneProcessUnderOneFOneBAndZeroBubble) {
  const Result& ref = one_process_k4();
  for (const std::string schedule : {"1f1b", "zb-h1"}) {
    const std::string flags = "--pp 2 --dp 2 --ep 2 --microbatches 2 --schedule " + schedule;
    const Result r = train("epgrid_pp2_ep2_" + schedule, 4, kMoE + kRouting + flags);
    expect_same_run(r, ref, flags.c_str());
    expect_same_routing_log(r, ref, flags);
  }
  const std::string v = "--pp 2 --dp 2 --ep 2 --microbatches 2 --schedule zb-v --virtual-stages 2";
  expect_same_run(train("epgrid_pp2_ep2_zbv", 4, kMoE + kRouting + v), ref, v.c_str());
  // ZeRO-2 shards the rest of each stage over dp; the experts are stepped whole on each ep rank.
  const std::string zero = "--pp 2 --dp 2 --ep 2 --microbatches 2 --zero 2";
  expect_same_run(train("epgrid_pp2_ep2_zero2", 4, kMoE + kRouting + zero), ref, zero.c_str());
}

// Each stage's ep group gathers its experts before the stages send theirs to rank 0 (parallel/model.h);
// each stage's ep ranks write their experts' optimizer state, ZeRO-1 shards too.
TEST(TrainGptExpertGrid, PipelineTimesEpSaveResumesThereAndAtOneProcess) {
  expect_save_resumes("epgrid_pp2_ep2", kMoE + kRouting, "--pp 2 --dp 2 --ep 2 --microbatches 2", "--grad-accum 4",
                      nullptr, 4);
  expect_save_resumes("epgrid_pp2_ep2_zero1", kMoE + kRouting, "--pp 2 --dp 2 --ep 2 --microbatches 2 --zero 1",
                      "--grad-accum 4", nullptr, 4);
}

TEST(TrainGptExpertGrid, PipelineTimesEpExportEqualsOneProcessExport) {
  expect_export_equals_one_process("epgrid_pp2_ep2_export", 4, "--pp 2 --dp 2 --ep 2 --microbatches 2",
                                   "--grad-accum 4");
}

// No ep layout is refused any more: tp with ZeRO trains (tests/test_train_gpt_expert_tp_zero.cpp), tp with pp
// and pp with ZeRO-3 too (tests/test_train_gpt_expert_pipeline_grid.cpp).
