// train_gpt --ep beside tensor parallelism under ZeRO-1/2/3 (issue 45), each configuration against one
// process through tests/train_gpt_run.h's helpers: tp 2 x dp 2, ep 2 (4 ranks). ep groups {0,2} {1,3},
// one per tp rank; expert-dp groups of one rank, so each rank keeps its two experts' optimizer state
// whole and its half of the rest's, sharded over dp (optim/distributed_optimizer.h).
//
// What tp adds to ZeRO under ep:
//   sequence parallel   the experts are whole on every tp rank, so their gradients are partial sums over
//                       tp, summed before their own buffer's reduce-scatter (tp_partial_grads.h) or, under
//                       ZeRO-3, before their unit's (fully_sharded.h)
//   the grad norm       over the world, each element on one shard: the experts on tp rank 0 of their ep
//                       rank (finalize_model_grads.h)
//   the checkpoint      the tp shards are joined into full tensors, the experts apart from the rest: over
//                       expert-dp, not dp, whose ep ranks hold other experts in the same slots
//                       (optim/checkpoint_tensor_parallel.h)
// dp 2 with --batch 4 is one process's --batch 4 --grad-accum 2 (tests/test_train_gpt_expert_grid.cpp).
#include <gtest/gtest.h>

#include "moe_runs.h"
#include "train_gpt_run.h"

using namespace loom;
using namespace loom::test;
using namespace loom::test::moe;

namespace {

const std::string kGrid = "--tp 2 --dp 2 --ep 2 ";
const std::string kSp = "--tp 2 --sequence-parallel --dp 2 --ep 2 ";

}  // namespace

// Every routing option (capacity, aux and z losses, the bias balancer, a shared expert): each tp rank routes
// every token of its micro-batch, as one process does. ZeRO-3's run is then saved at step 5 and resumed at
// the same grid (the same bits as straight through) and at one process (ep 2 -> 1, tp 2 -> 1: every
// expert's state whole in the checkpoint, by its global name).
TEST(TrainGptExpertTpZero, ZeroOneAndThreeEqualOneProcessWithEveryRoutingOptionAndResume) {
  const Result one = train("eptz_ref", 1, kMoE + kRouting + "--grad-accum 2");
  const Result zero1 = train("eptz_zero1", 4, kMoE + kRouting + kGrid + "--zero 1");
  expect_same_run(zero1, one, "--tp 2 --dp 2 --ep 2 --zero 1");
  expect_same_routing_log(zero1, one, "--tp 2 --dp 2 --ep 2 --zero 1");
  const Result zero3 = train("eptz_zero3", 4, kMoE + kRouting + kGrid + "--zero 3");
  expect_same_run(zero3, one, "--tp 2 --dp 2 --ep 2 --zero 3");
  expect_same_routing_log(zero3, one, "--tp 2 --dp 2 --ep 2 --zero 3");
  expect_save_resumes("eptz_zero3", kMoE + kRouting, kGrid + "--zero 3", "--grad-accum 2", nullptr, 4, &zero3);
}

// Sequence parallel: each tp rank routes its T / tp tokens, and the experts' partial gradients are summed
// over tp before ZeRO cuts them (ZeRO-2: their buckets' reduce-scatter; ZeRO-3: their unit's). ZeRO-2's
// run saved and resumed as above.
TEST(TrainGptExpertTpZero, SequenceParallelUnderZeroTwoAndThreeEqualsOneProcessDroplessAndResumes) {
  const Result one = train("eptz_ref_dropless", 1, kMoE + kDropless + "--grad-accum 2");
  const Result zero2 = train("eptz_zero2_sp", 4, kMoE + kDropless + kSp + "--zero 2");
  expect_same_run(zero2, one, "--tp 2 --sequence-parallel --dp 2 --ep 2 --zero 2");
  expect_same_routing_log(zero2, one, "--tp 2 --sequence-parallel --dp 2 --ep 2 --zero 2");
  const Result zero3 = train("eptz_zero3_sp", 4, kMoE + kDropless + kSp + "--zero 3");
  expect_same_run(zero3, one, "--tp 2 --sequence-parallel --dp 2 --ep 2 --zero 3");
  expect_save_resumes("eptz_zero2_sp", kMoE + kDropless, kSp + "--zero 2", "--grad-accum 2", nullptr, 4, &zero2);
}

// bf16 params, fp32 main params: ZeRO-1's shards are the replicated optimizer's run at the same grid within
// 1e-5. (Against one process bf16 drifts by its rounding: tests/test_train_gpt_expert_zero.cpp.)
TEST(TrainGptExpertTpZero, Bf16ZeroOneEqualsTheReplicatedOptimizer) {
  const std::string flags = kMoE + kGrid + "--dtype bf16 ";
  expect_same_run(train("eptz_bf16_zero1", 4, flags + "--zero 1"), train("eptz_bf16_zero0", 4, flags),
                  "bf16 --tp 2 --dp 2 --ep 2 --zero 1 vs no ZeRO", 1e-5, 1e-5, 1e-5);
}

// --export-hf under ZeRO-3 (every unit gathered, the experts over ep, the tp shards joined) equals one
// process's export: Mixtral's names, every expert whole.
TEST(TrainGptExpertTpZero, ZeroThreeExportEqualsOneProcessExport) {
  expect_export_equals_one_process("eptz_export", 4, kGrid + "--zero 3", "--grad-accum 2");
}
