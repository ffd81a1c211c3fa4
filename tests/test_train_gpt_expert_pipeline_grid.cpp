// train_gpt --ep with a pipeline and one more axis (issue 45): tp 2 x pp 2 x dp 2, ep 2 (8 ranks; under ZeRO-1
// and ZeRO-3 too) and pp 2 x dp 2, ep 2 under ZeRO-3 (4 ranks), each against one process through
// tests/train_gpt_run.h.
//
// Nothing new is built for them: the ep group is ep consecutive dp ranks of one (tp, cp, pp) coordinate
// (parallel/process_group_manager.h), so each stage's tp rank r has an ep group of its own
// (tp 2 x pp 2 x dp 2: ranks {0,2} {1,3} on stage 0, {4,6} {5,7} on stage 1), and under ZeRO-3 each stage's
// experts are a unit per block cut over that stage's expert-dp group (parallel/data_parallel/fully_sharded.h).
// What these runs check is that the pieces meet: the grad norm summed over pp x tp x ep with each
// expert counted on tp rank 0 of its ep rank (finalize_model_grads.h), each stage's ep group gathering its
// experts after tp joined its shards and before the stages send theirs to rank 0 (parallel/model.h),
// each stage's ep ranks writing their experts' optimizer state (tp-joined, or ZeRO-3's shards).
//
// The micro-batches: 2 per replica and dp 2, so one process's --grad-accum 4, each rank routing its own
// micro-batch (tests/test_train_gpt_expert_grid.cpp). Each equality run also saves (final weights) and
// exports (--export-hf, Mixtral's names), and is the straight run its save -> resume is compared with.
#include <gtest/gtest.h>

#include "moe_runs.h"
#include "train_gpt_run.h"

using namespace loom;
using namespace loom::test;
using namespace loom::test::moe;

namespace {

// What Mixtral exports (no shared experts, no routing bias): capacity and the aux loss. The other routing
// options (shared experts, z-loss, DeepSeek's bias) run dropless under sequence parallelism below.
const std::string kTpPpEp = "--tp 2 --pp 2 --dp 2 --ep 2 --microbatches 2";
const std::string kPpEpZero3 = "--pp 2 --dp 2 --ep 2 --microbatches 2 --zero 3";

// A run that also exports: the checkpoint's model file is .weights, the export's model.safetensors .exported.
struct Exported {
  Result run;
  nn::SafetensorsFile exported;
};
Exported train_exporting(const std::string& name, int ranks, const std::string& flags) {
  const fs::path out = work_dir() / (name + "_hf");
  Exported e{train(name, ranks, flags + " --export-hf " + out.string()), {}};
  if (e.run.status == 0) e.exported = nn::load_safetensors((out / "model.safetensors").string());
  return e;
}

const Exported& one_process_exportable() {
  static const Exported e = train_exporting("eppp_ref", 1, kExportable + "--grad-accum 4");
  return e;
}

// The run, its routing log and its export against one process's (every expert whole, by Mixtral's names).
void expect_one_process_through_export(const Exported& got, const std::string& what) {
  const Exported& one = one_process_exportable();
  expect_same_run(got.run, one.run, what.c_str());
  expect_same_routing_log(got.run, one.run, what);
  ASSERT_EQ(got.exported.tensors.size(), one.exported.tensors.size()) << what;
  EXPECT_TRUE(got.exported.contains("model.layers.1.block_sparse_moe.experts.3.w2.weight")) << what;
  for (const auto& [tensor, t] : one.exported.tensors) {
    const Diff d = diff_of(got.exported.at(tensor), t);
    EXPECT_LE(d.l2_diff, 1e-5 * d.l2_ref) << what << ": exported " << tensor;
  }
}

// Save at step 5 at the layout of `straight`, resume there (its steps 5-9, bit for bit) and in one process
// with --grad-accum 4 (within 1e-5): moe_runs.h's expect_save_resumes, its straight run the one above.
void expect_resumes_like(const Exported& straight, const std::string& name, int ranks, const std::string& parallel) {
  ASSERT_EQ(straight.run.status, 0) << straight.run.output;
  const Result first = train(name + "_first", ranks, kExportable + parallel + " --stop-at 5");
  ASSERT_EQ(first.status, 0) << first.output;
  const std::string resume = " --resume " + checkpoint(name + "_first");
  const Result resumed = train(name + "_resumed", ranks, kExportable + parallel + resume);
  const Result one = train(name + "_resumed_1", 1, kExportable + "--grad-accum 4" + resume);
  const Result& s = straight.run;
  for (const Result* r : {&resumed, &one}) {
    ASSERT_EQ(r->status, 0) << r->output;
    ASSERT_EQ(r->losses.size(), 5u);
  }
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(resumed.losses[i], s.losses[5 + i]) << parallel << " step " << 5 + i;
    EXPECT_EQ(resumed.grad_norms[i], s.grad_norms[5 + i]) << parallel << " step " << 5 + i;
    EXPECT_NEAR(one.losses[i], s.losses[5 + i], 1e-5 * s.losses[5 + i]) << parallel << " step " << 5 + i;
  }
  ASSERT_EQ(one.weights.tensors.size(), s.weights.tensors.size());
  for (const auto& [tensor, t] : s.weights.tensors) {
    EXPECT_EQ(resumed.weights.at(tensor).to_vector<float>(), t.to_vector<float>()) << parallel << ": " << tensor;
    const Diff d = diff_of(one.weights.at(tensor), t);
    EXPECT_LE(d.l2_diff, 1e-5 * d.l2_ref) << parallel << ": resumed at one process, " << tensor;
  }
}

}  // namespace

// ---- tp 2 x pp 2 x dp 2, ep 2: 8 ranks ----

TEST(TrainGptExpertPipelineGrid, TpTimesPpTimesEpEqualsOneProcessThroughSaveResumeAndExport) {
  const Exported got = train_exporting("eppp_tp2_pp2_ep2", 8, kExportable + kTpPpEp);
  expect_one_process_through_export(got, kTpPpEp + " (1f1b)");
  expect_resumes_like(got, "eppp_tp2_pp2_ep2", 8, kTpPpEp);
}

// Sequence parallel under zb-h1 and ZeRO-1: each stage's tp ranks route and dispatch their T / tp tokens, the
// experts' partial sums over tp added on every stage before their reduce-scatter over expert-dp; the weight
// gradients wait for W.
TEST(TrainGptExpertPipelineGrid, SequenceParallelTimesPpTimesEpUnderZeroBubbleAndZeroOneEqualsOneProcess) {
  const std::string flags = kTpPpEp + " --sequence-parallel --schedule zb-h1 --zero 1";
  const Result got = train("eppp_sp2_pp2_ep2_zbh1", 8, kMoE + kDropless + flags);
  const Result one = train("eppp_ref_dropless", 1, kMoE + kDropless + "--grad-accum 4");
  expect_same_run(got, one, flags.c_str());
  expect_same_routing_log(got, one, flags);
}

// ---- pp 2 x dp 2, ep 2, ZeRO-3: 4 ranks (and tp 2 on top: 8) ----

TEST(TrainGptExpertPipelineGrid, PpTimesEpUnderZeroThreeEqualsOneProcessThroughSaveResumeAndExport) {
  const Exported got = train_exporting("eppp_pp2_ep2_zero3", 4, kExportable + kPpEpZero3);
  expect_one_process_through_export(got, kPpEpZero3 + " (1f1b)");
  expect_resumes_like(got, "eppp_pp2_ep2_zero3", 4, kPpEpZero3);
}

// With tp too (8 ranks), under zb-v: each stage's chunks are the two ends of a V (stage 0 the embedding and the
// head, stage 1 both blocks, so stage 0's ep groups hold no experts); every routing option, the experts' weight
// gradients in W.
TEST(TrainGptExpertPipelineGrid, TpTimesPpTimesEpUnderZeroThreeAndZeroBubbleVEqualsOneProcess) {
  const std::string flags = "--tp 2 " + kPpEpZero3 + " --schedule zb-v --virtual-stages 2";
  const Result got = train("eppp_tp2_pp2_ep2_zero3_zbv", 8, kMoE + kRouting + flags);
  const Result one = train("eppp_ref_routing", 1, kMoE + kRouting + "--grad-accum 4");
  expect_same_run(got, one, flags.c_str());
  expect_same_routing_log(got, one, flags);
}
