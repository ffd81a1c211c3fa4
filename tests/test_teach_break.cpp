// train_gpt --teach-break NAME (parallel/teach/teach_break.h): each classic bug,
// reproduced on purpose, shows the symptom a learner should learn to recognise,
// and the test asserts that symptom on the run's own numbers. Without the flag
// every parity test in test_train_gpt_parallel.cpp is the counter-example.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "tests/train_gpt_run.h"

using namespace loom;
using namespace loom::test;

namespace {

// The numbers after `prefix` on every line of output that has it, in order.
std::vector<double> numbers_after(const std::string& output, const std::string& prefix) {
  std::vector<double> out;
  for (size_t at = output.find(prefix); at != std::string::npos; at = output.find(prefix, at + 1))
    out.push_back(std::stod(output.substr(at + prefix.size())));
  return out;
}

// The dp replicas of run r differ at every step (train_gpt's symptom line),
// and its losses leave the single-process run's.
void expect_replicas_drift(const Result& r, const char* what) {
  ASSERT_EQ(r.status, 0) << r.output;
  std::vector<double> d = numbers_after(r.output, "the dp replicas differ by max |param - rank 0's| = ");
  ASSERT_EQ(d.size(), 10u) << r.output;
  for (size_t i = 0; i < d.size(); ++i) EXPECT_GT(d[i], 1e-5) << what << ": step " << i + 1;
  const Result& ref = single_process_batch16();
  double worst = 0;
  for (size_t i = 0; i < 10; ++i) worst = std::max(worst, std::abs(r.losses[i] - ref.losses[i]) / ref.losses[i]);
  EXPECT_GT(worst, 1e-4) << what << ": the losses should leave the single-process run's";
  std::printf("[ measured ] %s: replicas differ by %.2e after step 1, %.2e after step 10; "
              "worst loss rel. difference %.2e\n", what, d.front(), d.back(), worst);
}

}  // namespace

// picotron issue #39: the hook all-reduces the parameter, not its gradient. The
// params agree right after each hook, then every rank steps on its own
// micro-batch's gradient, and the replicas are no longer one model.
TEST(TeachBreak, AllReducingTheParamInsteadOfTheGradLetsTheReplicasDrift) {
  expect_replicas_drift(train("teach_dp_param", 2, "--dp 2 --dp-mode naive --batch 8 --teach-break dp-allreduce-param"),
                        "dp-allreduce-param");
}

// The zero-bubble schedule's data-parallel sync given to the last B (where
// 1F1B's backward would fire the hooks) instead of the last W (where the split
// backward fires them): every W runs in no_sync. The naive wrapper, which
// reduces in its hooks, reduces nothing and the replicas drift as with
// dp-allreduce-param; the bucketed one launches the buckets no hook launched
// when the schedule finishes, so its numbers stay one process's.
TEST(TeachBreak, SyncingTheZeroBubbleScheduleAtBInsteadOfWLetsNaiveReplicasDrift) {
  const std::string flags = "--dp 2 --pp 2 --microbatches 2 --batch 4 --schedule zb-h1 --teach-break zb-sync-at-b";
  expect_replicas_drift(train("teach_zb_sync_naive", 4, flags + " --dp-mode naive"), "zb-sync-at-b, naive");
  expect_same_run(train("teach_zb_sync_bucket", 4, flags + " --dp-mode bucket"), single_process_batch16(),
                  "zb-sync-at-b, bucketed");
}

// Dividing by dp twice: every gradient is 1/dp of the true one. AdamW's update
// m / sqrt(v) does not see a constant factor, so the losses stay close; the
// logged grad norm (before clipping) is exactly half at dp 2.
TEST(TeachBreak, DividingByDpTwiceHalvesTheGradNorm) {
  Result r = train("teach_div2", 2, "--dp 2 --batch 8 --teach-break dp-divide-twice");
  ASSERT_EQ(r.status, 0) << r.output;
  const Result& ref = single_process_batch16();
  ASSERT_EQ(r.grad_norms.size(), 10u);
  EXPECT_NEAR(r.grad_norms[0] / ref.grad_norms[0], 0.5, 1e-5) << "step 1: the same params, half the gradient";
  EXPECT_NEAR(r.losses[0], ref.losses[0], 1e-6 * ref.losses[0]);
  std::vector<double> shown = numbers_after(r.output, "teach-break dp-divide-twice: step 1: grad norm ");
  std::vector<double> truth = numbers_after(r.output, ", the true one ");
  ASSERT_FALSE(shown.empty()) << r.output;
  ASSERT_FALSE(truth.empty()) << r.output;
  EXPECT_NEAR(shown[0] / ref.grad_norms[0], 0.5, 1e-3) << "the halved norm, as printed";
  EXPECT_NEAR(truth[0] / ref.grad_norms[0], 1.0, 1e-3) << "the true norm beside it, as printed";
  std::printf("[ measured ] dp-divide-twice: grad norm ratio at step 1 %.6f, loss at step 10 %.5f vs %.5f\n",
              r.grad_norms[0] / ref.grad_norms[0], r.losses[9], ref.losses[9]);
}

// Skipping the tied embedding's gradient sum: the first stage's wte learns from
// the embedding lookup only, the last stage's copy from the LM head only, and
// the one weight becomes two.
TEST(TeachBreak, SkippingTheTiedEmbeddingSyncLetsTheCopiesDriftApart) {
  Result r = train("teach_tied", 2, "--pp 2 --microbatches 2 --batch 8 --teach-break skip-tied-sync");
  ASSERT_EQ(r.status, 0) << r.output;
  std::vector<double> d = numbers_after(r.output, "||wte(first stage) - wte(last stage's copy)|| = ");
  ASSERT_EQ(d.size(), 10u) << r.output;
  EXPECT_GT(d.front(), 0.0) << "apart after the first step";
  EXPECT_GT(d.back(), d.front()) << "and further apart as training goes on";
  std::printf("[ measured ] skip-tied-sync: ||wte copies|| %.3e after step 1, %.3e after step 10\n", d.front(),
              d.back());
}

// found_inf over the dp group alone: with an inf in stage 0's gradient
// (--inject-overflow) stage 0 skips the step and stage 1 does not. The run
// stops at that step, naming it and the ranks on each side - no hang, no
// silently different stages.
TEST(TeachBreak, FoundInfOverTheWrongGroupIsDetectedNotAHang) {
  Result r = train("teach_found_inf", 2,
                   "--pp 2 --microbatches 2 --batch 8 --dtype fp16 --inject-overflow 2 "
                   "--teach-break found-inf-wrong-group");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.status, 124) << "timed out: a hang, not a detection";
  EXPECT_NE(r.output.find("ranks disagree on the decision whether to skip the step"), std::string::npos) << r.output;
  // the cause named is the teach-break, not differing flags
  EXPECT_NE(r.output.find("--teach-break found-inf-wrong-group reduced found_inf over the dp group"),
            std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("same flags"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 3 skipped for overflow: 'yes' on rank 0; 'no' on rank 1"), std::string::npos)
      << r.output;
}

TEST(TeachBreak, AnUnknownBugNamesTheKnownOnes) {
  Result r = train("teach_unknown", 1, "--teach-break off-by-one");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--teach-break: unknown bug 'off-by-one'; one of: none, dp-allreduce-param"),
            std::string::npos)
      << r.output;
}

// ZeRO-3 without the gather before backward: each unit's params were freed
// after its forward, so the first backward node that reads one (the last
// block's, the head keeps its own) finds released storage. The run stops there
// on every rank, with the error naming the tensor, instead of reading freed memory.
TEST(TeachBreak, Zero3FreeingAUnitBeforeItsBackwardStopsAtTheFirstRead) {
  Result r = train("teach_zero3_free", 2, "--dp 2 --batch 8 --zero 3 --teach-break zero3-free-before-backward");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("was released (a ZeRO-3 param read outside its unit's all-gather)"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << "no step may finish:\n" << r.output;
}

// Ring attention (--cp 2) merging a block's partial softmax without the max
// correction: silent at step 1 (every score ~0 at initialisation, so every
// block's max is alike and e^(m - m') ~ 1), then attention sharpens, the
// running max jumps between blocks, earlier blocks weigh e^(m' - m) too much
// and backward (with the wrong lse) no longer differentiates the forward: the
// run falls behind one process's. The schedule is 200 steps', stopped at 100.
TEST(TeachBreak, RingMergeWithoutTheMaxCorrectionFallsBehindOneProcess) {
  const std::string args = "--batch 16 --steps 200 --stop-at 100 --eval-every 50 --log-every 50";
  Result one = train("teach_ring_one", 1, args);
  Result r = train("teach_ring_nocorr", 2, "--cp 2 --teach-break ring-no-max-correction " + args);
  ASSERT_EQ(one.status, 0) << one.output;
  ASSERT_EQ(r.status, 0) << r.output;
  std::vector<double> moved = numbers_after(r.output, "the running max moved by up to ");
  ASSERT_EQ(moved.size(), 100u) << r.output;
  EXPECT_LT(moved.front(), 0.2) << "step 1: the scores are ~0, the max barely moves";
  EXPECT_GT(moved.back(), 20.0) << "step 100: the max jumps between blocks";
  ASSERT_EQ(r.losses.size(), 100u);
  EXPECT_NEAR(r.losses[0], one.losses[0], 1e-4 * one.losses[0]) << "silent at step 1";
  std::vector<double> val = numbers_after(r.output, "val loss "), val_one = numbers_after(one.output, "val loss ");
  ASSERT_EQ(val.size(), 2u) << r.output;
  ASSERT_EQ(val_one.size(), 2u) << one.output;
  EXPECT_GT(val[1], 1.3 * val_one[1]) << "step 100: behind one process";
  std::printf("[ measured ] ring-no-max-correction: max moved %.3f at step 1, %.1f at step 100; step 1 loss %.4f vs "
              "%.4f; val loss at step 100 %.4f vs one process's %.4f\n",
              moved.front(), moved.back(), r.losses[0], one.losses[0], val[1], val_one[1]);
}

TEST(TeachBreak, RingMergeBreakNeedsContextParallelism) {
  Result r = train("teach_ring_cp1", 1, "--teach-break ring-no-max-correction");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--teach-break ring-no-max-correction breaks ring attention's merge; it needs --cp 2 or "
                          "more"), std::string::npos) << r.output;
}

// Tensor parallelism giving every rank rank 0's kv heads (GQA: 4 query heads, 2
// kv heads, tp 2): rank 1's query heads read keys made from another group's
// weights. Nothing fails and the loss falls, but the split model is another
// model from the first step: step 1's loss is not one process's (chapter 15).
TEST(TeachBreak, KvRowsOfRankZeroMakeAnotherModelFromStepOne) {
  const std::string args = "--arch llama --heads 4 --kv-heads 2 --embd 64 --block 32 --batch 16 --steps 3";
  Result one = train("teach_kv_one", 1, args);
  Result r = train("teach_kv_rank0", 2, "--tp 2 --teach-break tp-kv-rows-of-rank-0 " + args);
  ASSERT_EQ(one.status, 0) << one.output;
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_EQ(r.losses.size(), 3u) << r.output;
  ASSERT_EQ(one.losses.size(), 3u) << one.output;
  EXPECT_GT(std::abs(r.losses[0] - one.losses[0]), 1e-3 * one.losses[0])
      << "step 1 is already another model (parity holds 1e-5)";
  EXPECT_LT(r.losses[2], r.losses[0]) << "and yet the loss falls";
  std::printf("[ measured ] tp-kv-rows-of-rank-0: step 1 loss %.4f vs one process's %.4f\n", r.losses[0],
              one.losses[0]);
}

// The router's aux losses not divided by the micro-batch count (nn/moe_aux_loss.h). On a corpus of one
// character every sequence is the same and the cross-entropy is 0, so the gradient is the aux and z
// losses' alone: at --grad-accum 2 it is twice one micro-batch's (without the bug equal:
// TrainGptMoE.AuxLossGradientCountsOncePerStepWhateverTheMicroBatchesAndLossScale). On text, step 1's
// gradient of 4 micro-batches of 4 sequences is within 1e-3 of one micro-batch of 16's without the bug
// (measured 1.1e-4: each micro-batch's balance loss is its own E sum f P, a mean of products, not the
// product of the means), 1.2e-2 off with it (chapter 19).
TEST(TeachBreak, LeavingTheAuxLossUnscaledMultipliesItsGradientByTheMicroBatches) {
  const fs::path corpus = work_dir() / "teach_one_char.txt";
  std::ofstream(corpus) << std::string(3000, 'a');
  const std::string aux = "--arch llama --experts 4 --experts-per-token 2 --router-aux-loss-coef 0.5 "
                          "--router-z-loss-coef 0.1 --batch 4 --data " + corpus.string() + " ";
  const Result k1 = train("teach_aux_k1", 1, aux, false);
  const Result k2 = train("teach_aux_k2", 1, aux + "--grad-accum 2 --teach-break moe-aux-unscaled", false);
  ASSERT_EQ(k1.status, 0) << k1.output;
  ASSERT_EQ(k2.status, 0) << k2.output;
  ASSERT_FALSE(k1.grad_norms.empty());
  ASSERT_FALSE(k2.grad_norms.empty());
  EXPECT_EQ(k1.losses[0], 0.0);
  EXPECT_NEAR(k2.grad_norms[0] / k1.grad_norms[0], 2.0, 1e-5) << "step 1: the same weights, twice the gradient";

  const std::string text = "--arch llama --experts 4 --experts-per-token 2 --router-aux-loss-coef 0.1 ";
  const Result one = train("teach_aux_b16", 1, text + "--batch 16", false);
  const Result fine = train("teach_aux_b4x4", 1, text + "--batch 4 --grad-accum 4", false);
  const Result broken = train("teach_aux_b4x4_broken", 1, text + "--batch 4 --grad-accum 4 --teach-break "
                                                                "moe-aux-unscaled", false);
  for (const Result* r : {&one, &fine, &broken}) ASSERT_EQ(r->status, 0) << r->output;
  EXPECT_NEAR(fine.grad_norms[0], one.grad_norms[0], 1e-3 * one.grad_norms[0]);
  EXPECT_GT(std::abs(broken.grad_norms[0] - one.grad_norms[0]), 5e-3 * one.grad_norms[0]);
  std::printf("[ measured ] moe-aux-unscaled: one char, grad-accum 2: grad norm %.6g vs %.6g; text, 4 x 4 "
              "sequences: step 1 grad norm %.6g (%.6g without the bug) vs one micro-batch's %.6g\n",
              k2.grad_norms[0], k1.grad_norms[0], broken.grad_norms[0], fine.grad_norms[0], one.grad_norms[0]);
  // Without micro-batches to divide by, there is nothing to break: refused before training.
  const Result refused = train("teach_aux_refused", 1, text + "--teach-break moe-aux-unscaled", false);
  EXPECT_NE(refused.status, 0);
  EXPECT_NE(refused.output.find("--teach-break moe-aux-unscaled leaves the aux losses undivided by the micro-batch "
                                "count; it shows with --grad-accum 2 or more"), std::string::npos) << refused.output;
}
