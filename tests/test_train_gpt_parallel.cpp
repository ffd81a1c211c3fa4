// Every parallel mode of train_gpt against the single-process run on the same
// global batch: per-step losses and final parameters within 1e-5 relative
// (tests/train_gpt_run.h explains the tolerances and how runs are launched).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "nn/safetensors.h"
#include "tensor/ops.h"
#include "tests/train_gpt_run.h"

using namespace loom;
using namespace loom::test;


TEST(TrainGptParallel, GradientAccumulationEqualsTheLargerBatch) {
  expect_same_run(train("accum", 1, "--batch 8 --grad-accum 2"), single_process_batch16(), "--batch 8 --grad-accum 2");
}

TEST(TrainGptParallel, BucketDataParallelTwoRanksMatchesOneProcess) {
  expect_same_run(train("bucket_dp2", 2, "--dp 2 --batch 8"), single_process_batch16(), "--dp 2 bucket");
}

TEST(TrainGptParallel, NaiveDataParallelTwoRanksMatchesOneProcess) {
  expect_same_run(train("naive_dp2", 2, "--dp 2 --dp-mode naive --batch 8"), single_process_batch16(), "--dp 2 naive");
}

TEST(TrainGptParallel, BucketDataParallelFourRanksMatchesOneProcess) {
  expect_same_run(train("bucket_dp4", 4, "--dp 4 --batch 4 --bucket-mb 0.01"), single_process_batch16(),
                  "--dp 4 bucket (tiny buckets)");
}

TEST(TrainGptParallel, NaiveDataParallelFourRanksMatchesOneProcess) {
  expect_same_run(train("naive_dp4", 4, "--dp 4 --dp-mode naive --batch 4"), single_process_batch16(), "--dp 4 naive");
}

TEST(TrainGptParallel, DataParallelWithGradientAccumulationMatchesOneProcess) {
  expect_same_run(train("bucket_dp2_accum", 2, "--dp 2 --batch 4 --grad-accum 2"), single_process_batch16(),
                  "--dp 2 --batch 4 --grad-accum 2");
}

TEST(TrainGptParallel, InvalidGridFailsOnEveryRankWithTheSizes) {
  Result r = train("bad_grid", 4, "--dp 3 --batch 4");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("world size 4 is not dp 3"), std::string::npos) << r.output;
}

TEST(TrainGptParallel, TraceHasARowPerRankWithComputeAndCommunication) {
  fs::path trace = work_dir() / "trace.json";
  Result r = train("traced", 2, "--dp 2 --batch 8 --trace " + trace.string());
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream f(trace);
  std::string json((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  for (const char* needle : {"\"name\": \"rank 0\"", "\"name\": \"rank 1\"", "\"name\": \"forward\"",
                             "\"name\": \"backward\"", "\"name\": \"optimizer step\"", "\"tid\": 1",
                             "all_reduce(avg, float32) dp", "wait for gradient all-reduce",
                             "\"cat\": \"launch to completion\", \"ph\": \"b\"", "\"ph\": \"e\""})
    EXPECT_NE(json.find(needle), std::string::npos) << needle;
  // The GPU tracks are a --device cuda run's only (tests/cuda/test_cuda_train_gpt_parallel.cpp).
  EXPECT_EQ(json.find("GPU compute stream"), std::string::npos);
  EXPECT_EQ(json.find("\"tid\": 3"), std::string::npos);
}

// A pipeline's timeline: every forward and backward as F<mb> / B<mb> on the
// compute track, every transfer on the communication track; LOOM_VERBOSE=1
// prints each transfer (rank, verb, peer, micro-batch, shape).
TEST(TrainGptParallel, PipelineTraceShowsMicroBatchesAndTransfers) {
  fs::path trace = work_dir() / "trace_pp.json";
  setenv("LOOM_VERBOSE", "1", 1);
  Result r = train("traced_pp", 2, "--pp 2 --microbatches 2 --batch 8 --trace " + trace.string());
  unsetenv("LOOM_VERBOSE");
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream f(trace);
  std::string json((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  for (const char* needle : {"\"name\": \"F0\"", "\"name\": \"F1\"", "\"name\": \"B0\"", "\"name\": \"B1\"",
                             // each transfer with its size: [8, 16, 32] fp32 = 16 KiB
                             "\"name\": \"send_forward mb1 (16 KiB)\"", "\"name\": \"recv_forward mb1 (16 KiB)\"",
                             "\"name\": \"send_backward mb0 (16 KiB)\"", "\"name\": \"recv_backward mb0 (16 KiB)\""})
    EXPECT_NE(json.find(needle), std::string::npos) << needle;
  // Micro-batch 1 (--batch 8 sequences of --block 16 tokens, --embd 32 wide), from stage 0 to stage 1.
  EXPECT_NE(r.output.find("[rank 0] send_forward -> stage 1 mb 1 [8, 16, 32] float32"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] recv_forward <- stage 0 mb 1 [8, 16, 32] float32"), std::string::npos) << r.output;
}

// Pipeline parallel: micro-batches split the same global batch as gradient
// accumulation does, so `--pp 2 --microbatches 4 --batch 4` is `--batch 16`.
TEST(TrainGptParallel, PipelineTwoStagesAfabMatchesOneProcess) {
  expect_same_run(train("pp2_afab", 2, "--pp 2 --microbatches 4 --batch 4 --schedule afab"), single_process_batch16(),
                  "--pp 2 afab");
}

TEST(TrainGptParallel, PipelineTwoStages1F1BMatchesOneProcess) {
  expect_same_run(train("pp2_1f1b", 2, "--pp 2 --microbatches 4 --batch 4 --schedule 1f1b"), single_process_batch16(),
                  "--pp 2 1f1b");
  expect_tied_copies_identical("pp2_1f1b");
}

TEST(TrainGptParallel, PipelineFourStagesBalancedMatchesOneProcess) {
  expect_same_run(train("pp4_balanced", 4, "--pp 4 --microbatches 4 --batch 4 --partition balanced"),
                  single_process_batch16(), "--pp 4 1f1b balanced");
}

TEST(TrainGptParallel, DataAndPipelineParallelTwoByTwoMatchesOneProcess) {
  expect_same_run(train("dp2_pp2", 4, "--dp 2 --pp 2 --microbatches 2 --batch 4"), single_process_batch16(),
                  "--dp 2 --pp 2");
  expect_tied_copies_identical("dp2_pp2");
}

TEST(TrainGptParallel, PrintScheduleDrawsOneRowPerStageWithTheBubble) {
  Result r = train("pp2_print", 2, "--pp 2 --microbatches 4 --batch 4 --print-schedule");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("stage 0 | F0 F1"), std::string::npos) << r.output;  // 1F1B warm-up: pp - rank - 1 = 1 extra forward
  EXPECT_NE(r.output.find("stage 1 | .  F0 B0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("theory (p - 1)/(m + p - 1) = 1/5 = 0.200"), std::string::npos) << r.output;
  // Both measured bubbles: with the transfers, and the same spans replayed without them, which
  // can only be shorter (every replayed event starts no later than it ran).
  double with = -1, without = -1;
  const size_t at = r.output.find("bubble: measured ");
  ASSERT_NE(at, std::string::npos) << r.output;
  ASSERT_EQ(std::sscanf(r.output.c_str() + at, "bubble: measured %lf with transfers, %lf without (the same F/B spans "
                        "replayed back to back)", &with, &without), 2) << r.output.substr(at, 200);
  EXPECT_GE(without, 0.0);
  EXPECT_LE(without, with);
  EXPECT_LT(with, 1.0);
}

// Interleaved 1F1B (--virtual-stages 2): each rank holds 2 chunks of the 4
// layers (rank 0: the embedding and block 1; rank 1: block 0 and the head),
// a micro-batch goes round the ring twice; the saved model is gathered from
// the chunks in the model's order.
TEST(TrainGptParallel, InterleavedPipelineMatchesOneProcess) {
  expect_same_run(train("pp2_v2", 2, "--pp 2 --virtual-stages 2 --microbatches 4 --batch 4"),
                  single_process_batch16(), "--pp 2 --virtual-stages 2");
  expect_tied_copies_identical("pp2_v2");
}

TEST(TrainGptParallel, InterleavedPipelineWithDataParallelMatchesOneProcess) {
  expect_same_run(train("dp2_pp2_v2", 4, "--dp 2 --pp 2 --virtual-stages 2 --microbatches 2 --batch 4"),
                  single_process_batch16(), "--dp 2 --pp 2 --virtual-stages 2");
  expect_tied_copies_identical("dp2_pp2_v2");
}

TEST(TrainGptParallel, PrintScheduleShowsChunksAndTheInterleavedBubble) {
  Result r = train("pp2_v2_print", 2, "--pp 2 --virtual-stages 2 --microbatches 4 --batch 4 --print-schedule");
  ASSERT_EQ(r.status, 0) << r.output;
  // Rank 0 warms up with 4 forwards; its chunk 1 starts as soon as rank 1's chunk 0 is done.
  EXPECT_NE(r.output.find("stage 0 | F0.0 F1.0 F0.1 F1.1 F2.0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("stage 1 | .    F0.0 F1.0 F0.1 B0.1 F1.1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("theory (p - 1)/(v m + p - 1) = 1/9 = 0.111"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(p - 1)/(v m) = 1/8 = 0.125"), std::string::npos) << r.output;
}

TEST(TrainGptParallel, InterleavedPipelineNeedsMicroBatchesAMultipleOfPp) {
  Result r = train("pp2_v2_m3", 2, "--pp 2 --virtual-stages 2 --microbatches 3 --batch 4");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("interleaved 1F1B needs --microbatches a multiple of --pp (Megatron's rule), got 3 "
                          "micro-batches for pp 2"),
            std::string::npos)
      << r.output;
}

// ---- issue 6: the distributed optimizer (ZeRO-1) and mixed precision ----------
//
// --zero reduce-scatters each gradient bucket and steps only this rank's shard
// of the fp32 state; the update per element is the same AdamW on the same
// averaged gradient, so the run matches the unsharded one (and one process)
// to the same 1e-7-level rounding as plain data parallel. dp = 3 does not
// divide the 16-sequence batch: it is compared with --batch 12 on one process.
// Shards cut through params at every dp size here (the GPT's buffer is cut
// into dp equal parts per bucket; tests/mpi/test_distributed_optimizer.cpp
// checks the ranges themselves).
TEST(TrainGptParallel, ZeroTwoRanksMatchesOneProcess) {
  expect_same_run(train("zero_dp2", 2, "--dp 2 --batch 8 --zero"), single_process_batch16(), "--dp 2 --zero");
}

TEST(TrainGptParallel, ZeroThreeRanksManyBucketsMatchesOneProcess) {
  static Result ref = train("single_b12", 1, "--batch 12");
  expect_same_run(train("zero_dp3", 3, "--dp 3 --batch 4 --zero --bucket-mb 0.01"), ref,
                  "--dp 3 --zero (tiny buckets)");
}

TEST(TrainGptParallel, ZeroFourRanksMatchesOneProcess) {
  expect_same_run(train("zero_dp4", 4, "--dp 4 --batch 4 --zero"), single_process_batch16(), "--dp 4 --zero");
}

// Without clipping nothing global stands between a bucket's reduce-scatter and
// its update: buckets are stepped inside the backward callback. Same numbers.
TEST(TrainGptParallel, ZeroEarlyBucketStepsMatchOneProcess) {
  static Result ref = train("single_b16_noclip", 1, "--batch 16 --grad-clip 0");
  expect_same_run(train("zero_dp2_noclip", 2, "--dp 2 --batch 8 --zero --grad-clip 0 --bucket-mb 0.01"), ref,
                  "--dp 2 --zero --grad-clip 0 (early steps)");
}

// ZeRO, pipeline and early steps together: stage by stage, a bucket's shard
// is stepped as soon as its reduce-scatter is done, while later micro-batches'
// backward still runs on the same stage.
TEST(TrainGptParallel, ZeroWithPipelineEarlyBucketStepsMatchOneProcess) {
  static Result ref = train("single_b16_noclip", 1, "--batch 16 --grad-clip 0");
  expect_same_run(train("zero_dp2_pp2_noclip", 4, "--dp 2 --pp 2 --microbatches 2 --batch 4 --zero --grad-clip 0"),
                  ref, "--dp 2 --pp 2 --zero --grad-clip 0 (early steps)");
}

TEST(TrainGptParallel, ZeroWithPipelineMatchesOneProcess) {
  expect_same_run(train("zero_dp2_pp2", 4, "--dp 2 --pp 2 --microbatches 2 --batch 4 --zero"),
                  single_process_batch16(), "--dp 2 --pp 2 --zero");
}

// --overlap-param-gather (optim/param_gather_overlap.h): each layer waits for
// its own buckets' param all-gathers in its forward pre-hook, with clipping on
// (the default --grad-clip 1.0) and many buckets. The same numbers as one
// process, and bit for bit those of --zero without it (only the waits move).
TEST(TrainGptParallel, ZeroOverlapParamGatherMatchesOneProcess) {
  Result overlapped = train("zero_dp2_opg", 2, "--dp 2 --batch 8 --zero --bucket-mb 0.01 --overlap-param-gather");
  expect_same_run(overlapped, single_process_batch16(), "--dp 2 --zero --overlap-param-gather");
  Result plain = train("zero_dp2_small", 2, "--dp 2 --batch 8 --zero --bucket-mb 0.01");
  ASSERT_EQ(plain.status, 0) << plain.output;
  EXPECT_EQ(overlapped.losses, plain.losses);
  EXPECT_EQ(overlapped.grad_norms, plain.grad_norms);
  EXPECT_NE(overlapped.output.find("param all-gathers overlapped with forward"), std::string::npos) << overlapped.output;
}

TEST(TrainGptParallel, ZeroOverlapParamGatherWithPipelineMatchesOneProcess) {
  expect_same_run(train("zero_dp2_pp2_opg", 4,
                        "--dp 2 --pp 2 --microbatches 2 --batch 4 --zero --bucket-mb 0.01 --overlap-param-gather"),
                  single_process_batch16(), "--dp 2 --pp 2 --zero --overlap-param-gather");
}

// --export-hf without --save after --overlap-param-gather: the last step's
// all-gathers are waited for before the export reads the params (nothing else
// waits for them: no next forward). Read as they were, the export held
// buckets not yet gathered, from before the last step (a race: measured 2.4e-2
// max relative; this test failed 5 runs in 5 on 2 shared cores).
TEST(TrainGptParallel, ZeroOverlapParamGatherExportEqualsOneProcessExport) {
  const std::string cfg = "--dp 2 --batch 8 --zero --bucket-mb 0.01 --overlap-param-gather";
  expect_same_run(train_and_export("zero_dp2_opg_export", 2, cfg), train_and_export("single_b16_export", 1, "--batch 16"),
                  (cfg + " --export-hf").c_str());
}

TEST(TrainGptParallel, OverlapParamGatherWithoutZeroIsRefused) {
  Result r = train("opg_no_zero", 1, "--batch 16 --overlap-param-gather");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--overlap-param-gather overlaps ZeRO-1/2's param all-gathers; it needs --zero 1 or 2"),
            std::string::npos) << r.output;
}

// Sharded checkpoints: 5 steps, save, resume on a different dp size (the
// shards are gathered from the files and re-split), 5 more steps. The resumed
// run appends to the same log, so its 10 losses are compared with the
// straight single-process run.
TEST(TrainGptParallel, ZeroCheckpointReshardsFromTwoToFourRanks) {
  Result first = train("reshard_2_4", 2, "--dp 2 --batch 8 --zero --stop-at 5");
  ASSERT_EQ(first.status, 0) << first.output;
  ASSERT_TRUE(fs::exists(work_dir() / "reshard_2_4.step5.optim.1.safetensors"));  // one shard per rank
  expect_same_run(train("reshard_2_4", 4, "--dp 4 --batch 4 --zero --resume " + checkpoint("reshard_2_4")),
                  single_process_batch16(), "--zero dp 2 -> save -> dp 4");
}

TEST(TrainGptParallel, ZeroCheckpointReshardsFromFourRanksToOne) {
  Result first = train("reshard_4_1", 4, "--dp 4 --batch 4 --zero --stop-at 5");
  ASSERT_EQ(first.status, 0) << first.output;
  expect_same_run(train("reshard_4_1", 1, "--batch 16 --resume " + checkpoint("reshard_4_1")),
                  single_process_batch16(), "--zero dp 4 -> save -> one process");
}

// Same layout: bit-exact. A pipeline run saves too (stages gathered into one model file).
TEST(TrainGptParallel, ZeroPipelineResumeIsBitExact) {
  const std::string cfg = "--dp 2 --pp 2 --microbatches 2 --batch 4 --zero --dtype bf16";
  Result straight = train("zero_pp_straight", 4, cfg);
  Result first = train("zero_pp_resumed", 4, cfg + " --stop-at 5");
  ASSERT_EQ(first.status, 0) << first.output;
  Result resumed = train("zero_pp_resumed", 4, cfg + " --resume " + checkpoint("zero_pp_resumed"));
  ASSERT_EQ(straight.status, 0) << straight.output;
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  ASSERT_EQ(resumed.losses.size(), 10u);
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(resumed.losses[i], straight.losses[i]) << "step " << i;
  for (const auto& [name, t] : straight.weights.tensors)
    EXPECT_EQ(ops::to(resumed.weights.at(name), kFloat32).to_vector<float>(), ops::to(t, kFloat32).to_vector<float>())
        << name;
}

// bf16 tracks fp32. Measured: worst per-step loss difference 1.5e-4 relative
// over these 10 steps. Why it stays small: bf16 rounds each param and
// activation to 8 significant bits (relative error <= 2^-9 = 2e-3), but the
// optimizer steps fp32 main params (no update is lost to rounding), the loss
// is computed in fp32, and a loss is a mean over 256 tokens whose rounding
// errors are independent, so they largely cancel. 1e-3 leaves 6x margin.
TEST(TrainGptParallel, Bf16TracksFp32) {
  Result bf16 = train("bf16_zero_dp2", 2, "--dp 2 --batch 8 --zero --dtype bf16");
  ASSERT_EQ(bf16.status, 0) << bf16.output;
  const Result& fp32 = single_process_batch16();
  double worst = 0;
  for (size_t i = 0; i < 10; ++i) worst = std::max(worst, std::abs(bf16.losses[i] - fp32.losses[i]) / fp32.losses[i]);
  EXPECT_LE(worst, 1e-3);
  std::printf("[ measured ] bf16 (--dp 2 --zero) vs fp32: worst loss rel. difference %.2e\n", worst);
}

// fp16 (dynamic loss scaling, scale 2^16) tracks fp32 too, losses and grad
// norms: the mechanism is checked, not only the arithmetic - a step that
// forgot to unscale would log norms 2^16 times too large (and, clipped to
// --grad-clip, take different steps). fp16 keeps 11 significant bits (2^-12
// relative), finer than bf16's 8, so the loose bound is bf16's, 1e-3; the grad
// norms, of fp16 gradients of fp16 activations, within 1e-2.
TEST(TrainGptParallel, Fp16TracksFp32) {
  Result fp16 = train("fp16_dp2", 2, "--dp 2 --batch 8 --dtype fp16");
  ASSERT_EQ(fp16.status, 0) << fp16.output;
  const Result& fp32 = single_process_batch16();
  ASSERT_EQ(fp16.losses.size(), fp32.losses.size());
  ASSERT_EQ(fp16.grad_norms.size(), fp32.grad_norms.size());
  double worst_loss = 0, worst_norm = 0;
  for (size_t i = 0; i < fp32.losses.size(); ++i) {
    worst_loss = std::max(worst_loss, std::abs(fp16.losses[i] - fp32.losses[i]) / fp32.losses[i]);
    worst_norm = std::max(worst_norm, std::abs(fp16.grad_norms[i] - fp32.grad_norms[i]) / fp32.grad_norms[i]);
  }
  EXPECT_LE(worst_loss, 1e-3);
  EXPECT_LE(worst_norm, 1e-2);
  std::printf("[ measured ] fp16 (--dp 2) vs fp32: worst loss rel. difference %.2e, grad norm %.2e\n", worst_loss,
              worst_norm);
}

// fp16 with an inf forced into rank 0's gradient buffer at step 3, in a param
// of the first pipeline stage only: found_inf's all-reduce (MAX) must make
// every rank skip exactly that step, the scale halves, and training continues.
// A skipped step on only some ranks would split the replicas; the losses
// afterwards match the same run on one process, which skips the same step.
// With --zero and small buckets the param's bucket is reduce-scattered, so
// only the rank owning that element sees the inf (found_inf over the world);
// without --zero the bucket all-reduce gives it to stage 0's dp group, never
// to stage 1 (found_inf over the model-parallel group).
void expect_overflow_skipped_everywhere(const std::string& name, const std::string& parallel) {
  const std::string inject = " --dtype fp16 --inject-overflow 3";
  Result par = train(name, 4, parallel + inject);
  static Result one = train("fp16_overflow_1", 1, "--batch 16" + inject);
  ASSERT_EQ(par.status, 0) << par.output;
  ASSERT_EQ(par.log.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    const bool skipped = par.log[i].find("\"skipped\": true") != std::string::npos;
    EXPECT_EQ(skipped, i == 3) << par.log[i];
    const std::string scale = i <= 3 ? "\"loss_scale\": 65536" : "\"loss_scale\": 32768";
    EXPECT_NE(par.log[i].find(scale), std::string::npos) << par.log[i];
  }
  EXPECT_NE(par.output.find("overflow: step skipped, loss scale -> 32768"), std::string::npos) << par.output;
  // fp16 params round the dp/pp sums' last bits differently: losses measured
  // 5.8e-6 apart, hence 1e-4. Params: Adam-amplified rounding noise (see the
  // top of this file), which fp16's coarser rounding makes ~1e2-1e3 larger
  // than fp32's: measured 5.9e-4 per tensor at worst (attn.c_proj.bias) and
  // 4.5e-3 of the model's scale for the key bias, hence 1e-2. The grad norm
  // (of fp16 gradients) measured 1.4e-4 apart, hence 1e-3 - still far from
  // the 2x of a dp that sums instead of averaging.
  expect_same_run(par, one, ("fp16 overflow, " + parallel + " vs one process").c_str(), 1e-4, 1e-2, 1e-3);
}

TEST(TrainGptParallel, Fp16OverflowSkipsTheStepOnEveryRank) {
  expect_overflow_skipped_everywhere("fp16_overflow",
                                     "--dp 2 --pp 2 --microbatches 2 --batch 4 --zero --bucket-mb 0.01");
}

// Loss scaling with the param all-gathers overlapped: the skipped step launches
// no all-gather, and the next forward's hooks find none to wait for.
TEST(TrainGptParallel, Fp16OverflowWithOverlappedParamGatherSkipsTheStepOnEveryRank) {
  expect_overflow_skipped_everywhere(
      "fp16_overflow_opg", "--dp 2 --pp 2 --microbatches 2 --batch 4 --zero --bucket-mb 0.01 --overlap-param-gather");
}

TEST(TrainGptParallel, Fp16OverflowOnOneStageSkipsTheStepOnBothStages) {
  expect_overflow_skipped_everywhere("fp16_overflow_pp", "--dp 2 --pp 2 --microbatches 2 --batch 4");
}

// Data parallelism over d ranks is gradient accumulation over d micro-batches,
// overflow decisions included: each rank's backward carries the loss scale / d
// (MixedPrecisionOptions::grad_mean_ranks), so its activation gradients are
// one process's and its fp16 weight gradients the same partial sums as one
// micro-batch's. Started at 2^21, too large for this model, both back off the
// same steps; a rank backpropagating at the full scale (the old code) overflows
// fp16 at 4x smaller gradients and backs off twice more.
TEST(TrainGptParallel, Fp16DataParallelOverflowsAsGradientAccumulation) {
  const std::string common = " --dtype fp16 --arch llama --kv-heads 1 --loss-scale 2097152";
  Result dp = train("fp16_scale_dp4", 4, "--dp 4 --batch 4" + common);
  Result ga = train("fp16_scale_ga4", 1, "--batch 4 --grad-accum 4" + common);
  ASSERT_EQ(dp.status, 0) << dp.output;
  ASSERT_EQ(ga.status, 0) << ga.output;
  ASSERT_EQ(dp.log.size(), ga.log.size());
  int skipped = 0;
  for (size_t i = 0; i < ga.log.size(); ++i) {
    const bool ga_skipped = ga.log[i].find("\"skipped\": true") != std::string::npos;
    skipped += ga_skipped;
    EXPECT_EQ(dp.log[i].find("\"skipped\": true") != std::string::npos, ga_skipped) << dp.log[i] << "\n" << ga.log[i];
    EXPECT_EQ(field(dp.log[i], "loss_scale"), field(ga.log[i], "loss_scale")) << "step " << i + 1;
  }
  EXPECT_EQ(skipped, 2) << "the model's gradients fit fp16 from 2^19 (measured): 2^21 and 2^20 overflow";
  expect_same_run(dp, ga, "fp16 --dp 4 vs one process --grad-accum 4", 1e-4, 1e-2, 1e-3);
}

// --memory-report's rows: each rank's measured bytes per parameter (params +
// main_grad buffer + optimizer state, from the allocator) against the formula
// (optim/memory_report.h). Measured exceeds it only by the buckets' padding.
void expect_memory_report(const std::string& name, const std::string& args, double bytes_per_param) {
  Result r = train(name, 2, args + " --memory-report");
  ASSERT_EQ(r.status, 0) << r.output;
  const size_t at = r.output.find("memory after step 1");
  ASSERT_NE(at, std::string::npos) << r.output;
  std::istringstream in(r.output.substr(at));
  int rows = 0;
  for (std::string line; std::getline(in, line);) {
    int rank = 0;
    long long n = 0;
    double params[2], grads[2], state[2], per_param[2];  // MiB (bytes/param): measured, predicted
    if (std::sscanf(line.c_str(), " %d %lld | %lf / %lf | %lf / %lf | %lf / %lf | %lf / %lf |", &rank, &n,
                    &params[0], &params[1], &grads[0], &grads[1], &state[0], &state[1], &per_param[0],
                    &per_param[1]) != 10)
      continue;
    ++rows;
    EXPECT_DOUBLE_EQ(per_param[1], bytes_per_param) << line;
    EXPECT_GE(per_param[0], per_param[1]) << line;
    EXPECT_LE(per_param[0], 1.01 * per_param[1]) << line;
    EXPECT_NEAR(state[0], state[1], 0.01) << line;  // printed to 0.01 MiB
  }
  EXPECT_EQ(rows, 2) << r.output;
}

TEST(TrainGptParallel, MemoryReportShowsTheShardedOptimizerState) {
  // bf16 params 2 + fp32 main_grad 4 + (fp32 main params, exp_avg, exp_avg_sq) 12 / dp 2
  expect_memory_report("memory_zero", "--dp 2 --batch 8 --zero --dtype bf16", 12.0);
}

TEST(TrainGptParallel, MemoryReportShowsTheReplicatedOptimizerState) {
  // fp32 params 4 + main_grad 4 + exp_avg, exp_avg_sq 8 (the fp32 params are their own main params)
  expect_memory_report("memory_replicated", "--dp 2 --batch 8", 16.0);
}

// Resharding across layouts the tests above do not cover: a pipeline's
// checkpoint resumed without one, and with another pipeline; a ZeRO shard set
// of three ranks resumed on one; fp16's loss-scaler state carried across a
// change of dp (a short growth window, so the scale changes before and after
// the save: a lost scaler state shows in the logged loss_scale).
TEST(TrainGptParallel, PipelineCheckpointResumesWithoutAPipeline) {
  Result first = train("reshard_pp2_dp2", 2, "--pp 2 --microbatches 2 --batch 8 --stop-at 5");
  ASSERT_EQ(first.status, 0) << first.output;
  expect_same_run(train("reshard_pp2_dp2", 2, "--dp 2 --batch 8 --resume " + checkpoint("reshard_pp2_dp2")),
                  single_process_batch16(), "--pp 2 -> save -> --dp 2");
}

TEST(TrainGptParallel, DataParallelCheckpointResumesOnAFourStagePipeline) {
  Result first = train("reshard_dp2_pp4", 2, "--dp 2 --batch 8 --zero --stop-at 5");
  ASSERT_EQ(first.status, 0) << first.output;
  expect_same_run(train("reshard_dp2_pp4", 4,
                        "--pp 4 --microbatches 4 --batch 4 --partition balanced --resume " +
                            checkpoint("reshard_dp2_pp4")),
                  single_process_batch16(), "--dp 2 --zero -> save -> --pp 4");
}

TEST(TrainGptParallel, ZeroCheckpointReshardsFromThreeRanksToOne) {
  static Result ref = train("single_b12_reshard", 1, "--batch 12");
  Result first = train("reshard_3_1", 3, "--dp 3 --batch 4 --zero --bucket-mb 0.01 --stop-at 5");
  ASSERT_EQ(first.status, 0) << first.output;
  expect_same_run(train("reshard_3_1", 1, "--batch 12 --resume " + checkpoint("reshard_3_1")), ref,
                  "--zero dp 3 -> save -> one process");
}

TEST(TrainGptParallel, Fp16LossScalerStateSurvivesAReshard) {
  const std::string fp16 = " --dtype fp16 --loss-scale-window 3 --zero";
  Result straight = train("fp16_reshard_straight", 2, "--dp 2 --batch 8" + fp16);
  Result first = train("fp16_reshard", 2, "--dp 2 --batch 8 --stop-at 5" + fp16);
  ASSERT_EQ(first.status, 0) << first.output;
  Result resumed = train("fp16_reshard", 4, "--dp 4 --batch 4 --resume " + checkpoint("fp16_reshard") + fp16);
  ASSERT_EQ(straight.status, 0) << straight.output;
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  ASSERT_EQ(resumed.log.size(), 10u);
  // Measured: the scale grows at step 3 (65536 -> 131072) and again at step 6
  // (3 clean steps: 3, 4, 5), where both runs overflow and skip. Steps 5 and 6
  // match only if the resumed run got the scale and the growth tracker back.
  // After that the runs may part: dp 4's per-rank fp16 gradients (4 rows, not
  // 8) overflow at other steps than dp 2's (measured: step 7 skipped at dp 4 only).
  auto scale = [](const std::string& line) {
    size_t k = line.find("\"loss_scale\": ");
    return line.substr(k, line.find(',', k) - k);
  };
  for (size_t i = 0; i <= 6; ++i) EXPECT_EQ(scale(resumed.log[i]), scale(straight.log[i])) << "step " << i;
  EXPECT_EQ(scale(straight.log[6]), "\"loss_scale\": 262144") << "the scale must have grown at step 6";
  for (size_t i = 0; i <= 5; ++i)  // fp16 sums of 4 rows round differently from 8: 1e-4 (see the overflow tests)
    EXPECT_NEAR(resumed.losses[i], straight.losses[i], 1e-4 * straight.losses[i]) << "step " << i;
}

// ---- tensor parallelism (--tp): each matmul split over the tp ranks ----------------------
// Every run below also checks, at its --save, that the params each tp rank
// holds whole (layernorms, row-parallel biases, wpe) are bit-identical across
// the tp ranks (parallel/tensor_parallel/replicas.h): a run whose copies drift fails.

TEST(TrainGptParallel, TensorParallelTwoRanksMatchesOneProcess) {
  expect_same_run(train("tp2", 2, "--tp 2 --batch 16"), single_process_batch16(), "--tp 2");
}

TEST(TrainGptParallel, TensorParallelFourRanksMatchesOneProcess) {
  // 4 heads, so that each of 4 ranks holds one; the vocabulary (35) is padded to 36.
  static Result ref = train("single_b16_h4", 1, "--batch 16 --heads 4");
  expect_same_run(train("tp4", 4, "--tp 4 --heads 4 --batch 16"), ref, "--tp 4");
}

TEST(TrainGptParallel, SequenceParallelTwoRanksMatchesOneProcess) {
  expect_same_run(train("tp2_sp", 2, "--tp 2 --sequence-parallel --batch 16"), single_process_batch16(),
                  "--tp 2 --sequence-parallel");
}

TEST(TrainGptParallel, DataAndTensorParallelTwoByTwoMatchesOneProcess) {
  expect_same_run(train("dp2_tp2", 4, "--dp 2 --tp 2 --batch 8"), single_process_batch16(), "--dp 2 --tp 2");
}

TEST(TrainGptParallel, PipelineAndTensorParallelTwoByTwoMatchesOneProcess) {
  expect_same_run(train("pp2_tp2", 4, "--pp 2 --tp 2 --microbatches 2 --batch 8"), single_process_batch16(),
                  "--pp 2 --tp 2");
}

// ZeRO-1 with sequence parallelism and small buckets (--bucket-mb 0.01: the
// layernorms spread over many reduce-scattered buckets): each bucket's
// partial layernorm gradients, accumulated over both micro-batches, are summed
// over tp before its reduce-scatter (data_parallel_bucket.h). Summed after the
// sync instead, the run stopped at the first step: only shards were left.
TEST(TrainGptParallel, SequenceParallelWithZeroInSmallBucketsMatchesOneProcess) {
  const std::string cfg = "--dp 2 --tp 2 --sequence-parallel --batch 4 --grad-accum 2 --zero 1 --bucket-mb 0.01";
  expect_same_run(train("dp2_tp2_sp_zero_small_buckets", 4, cfg), single_process_batch16(), cfg.c_str());
}

// All three axes on 8 ranks (oversubscribed), with the sharded optimizer and
// sequence parallelism: the tied embedding's gradient sum (embedding group),
// SP's layernorm sums (tp) and ZeRO's reduce-scatter (dp) all in one step.
//
// Final params within 2e-5 per tensor, not 1e-5: these runs sum each gradient
// in the most pieces (tp all-reduces and SP reduce-scatters, micro-batches, dp
// reduce-scatter), and AdamW turns the last bits of near-zero gradients into
// ~lr steps (see tests/train_gpt_run.h). Worst tensor measured: 6.8e-6 in the
// Release build, 1.03e-5 in the ASan build (-O1, other float code), both
// blocks.1.mlp.c_fc.bias; the losses stay within 6e-8 and the grad norms 5e-7.
constexpr double kEightRankParamTol = 2e-5;

TEST(TrainGptParallel, ThreeAxesEightRanksWithZeroMatchesOneProcess) {
  expect_same_run(train("dp2_pp2_tp2_zero", 8,
                        "--dp 2 --pp 2 --tp 2 --microbatches 2 --batch 4 --zero --sequence-parallel"),
                  single_process_batch16(), "--dp 2 --pp 2 --tp 2 --zero --sequence-parallel", 1e-5,
                  kEightRankParamTol);
}

// bf16 under tp tracks fp32 as bf16 does without it (Bf16TracksFp32).
TEST(TrainGptParallel, TensorParallelBf16TracksFp32) {
  Result bf16 = train("bf16_dp2_tp2_zero", 4, "--dp 2 --tp 2 --batch 8 --zero --dtype bf16");
  ASSERT_EQ(bf16.status, 0) << bf16.output;
  const Result& fp32 = single_process_batch16();
  double worst = 0;
  for (size_t i = 0; i < 10; ++i) worst = std::max(worst, std::abs(bf16.losses[i] - fp32.losses[i]) / fp32.losses[i]);
  EXPECT_LE(worst, 1e-3);
  std::printf("[ measured ] bf16 (--dp 2 --tp 2 --zero) vs fp32: worst loss rel. difference %.2e\n", worst);
}

// The checkpoint of a tp run is the full model, whatever tp: saved at tp 2, it
// resumes on one process and at dp 2 x tp 2 (ZeRO), with the straight run's losses.
TEST(TrainGptParallel, TensorParallelCheckpointResumesOnOneProcess) {
  Result first = train("tp2_to_1", 2, "--tp 2 --batch 16 --stop-at 5");
  ASSERT_EQ(first.status, 0) << first.output;
  // The model file is the unsplit GPT: wte has the true vocabulary's rows, no padding.
  ASSERT_EQ(first.weights.at("wte.weight").shape(), single_process_batch16().weights.at("wte.weight").shape());
  expect_same_run(train("tp2_to_1", 1, "--batch 16 --resume " + checkpoint("tp2_to_1")), single_process_batch16(),
                  "--tp 2 -> save -> one process");
}

TEST(TrainGptParallel, TensorParallelCheckpointResumesAtDataAndTensorParallel) {
  Result first = train("tp2_to_dp2tp2", 2, "--tp 2 --batch 16 --stop-at 5");
  ASSERT_EQ(first.status, 0) << first.output;
  expect_same_run(train("tp2_to_dp2tp2", 4, "--dp 2 --tp 2 --batch 8 --zero --resume " + checkpoint("tp2_to_dp2tp2")),
                  single_process_batch16(), "--tp 2 -> save -> --dp 2 --tp 2 --zero");
}

TEST(TrainGptParallel, OneProcessCheckpointResumesUnderTensorParallel) {
  Result first = train("one_to_tp2", 1, "--batch 16 --stop-at 5");
  ASSERT_EQ(first.status, 0) << first.output;
  expect_same_run(train("one_to_tp2", 2, "--tp 2 --sequence-parallel --batch 16 --resume " + checkpoint("one_to_tp2")),
                  single_process_batch16(), "one process -> save -> --tp 2 --sequence-parallel");
}

TEST(TrainGptParallel, TensorParallelThatDoesNotDivideTheHeadsIsNamed) {
  Result r = train("tp_bad_heads", 1, "--tp 4");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--tp 4 must divide --heads 2"), std::string::npos) << r.output;
}

// --memory-report under tp: the table's rows as without tp (each rank's own
// params, fp32: 4 + 4 + 8 bytes each), and the line that says where the count
// comes from: 1/tp of the split tensors plus the replicated ones, equal to the
// parameters the rank holds, and about half of the one-process model.
TEST(TrainGptParallel, MemoryReportUnderTensorParallelShowsTheSplit) {
  expect_memory_report("memory_tp2", "--tp 2 --batch 16", 16.0);
  Result r = train("memory_tp2_line", 2, "--tp 2 --batch 16 --memory-report");
  ASSERT_EQ(r.status, 0) << r.output;
  long long split = 0, padding = 0, replicated = 0, per_rank = 0, measured = 0;
  int tp = 0;
  const size_t at = r.output.find("tensor parallel, rank 0's stage");
  ASSERT_NE(at, std::string::npos) << r.output;
  ASSERT_EQ(std::sscanf(r.output.c_str() + at,
                        "tensor parallel, rank 0's stage: params per rank = (split %lld + vocab padding %lld) / tp %d "
                        "+ replicated %lld = %lld (measured %lld)",
                        &split, &padding, &tp, &replicated, &per_rank, &measured),
            6)
      << r.output.substr(at, 200);
  EXPECT_EQ(tp, 2);
  EXPECT_EQ(per_rank, measured);
  EXPECT_EQ(per_rank, (split + padding) / 2 + replicated);
  // The whole model, as one process counts it (the checkpoint's tensors).
  long long whole = 0;
  for (const auto& [name, t] : single_process_batch16().weights.tensors) whole += t.numel();
  EXPECT_EQ(split + replicated, whole);
  EXPECT_LT(measured, whole * 0.6) << "a tp 2 rank holds a little over half of the model";
}

// The trace of a tp run shows the tp collectives on each rank's communication
// row, inside the forward and the backward spans of its compute row:
// Megatron's all-reduces, where they happen. (Without a pipeline the spans are
// "forward" and "backward", as on one process; a pipeline's are F<mb> / B<mb>.)
TEST(TrainGptParallel, TensorParallelTraceShowsTheCollectivesInsideForwardAndBackward) {
  fs::path trace = work_dir() / "trace_tp.json";
  Result r = train("traced_tp", 2, "--tp 2 --batch 16 --trace " + trace.string());
  ASSERT_EQ(r.status, 0) << r.output;
  struct Span {
    std::string name;
    double ts, dur;
    int pid;
  };
  std::vector<Span> spans;
  std::ifstream f(trace);
  for (std::string line; std::getline(f, line);) {
    if (line.find("\"ph\": \"X\"") == std::string::npos) continue;
    const size_t a = line.find("\"name\": \"") + 9, b = line.find('"', a);
    Span s{line.substr(a, b - a), field(line, "ts"), field(line, "dur"), int(field(line, "pid"))};
    spans.push_back(s);
  }
  for (int pid : {0, 1}) {
    int in_forward = 0, in_backward = 0;
    for (const Span& c : spans) {
      if (c.pid != pid || c.name.find(" tp (size 2)") == std::string::npos) continue;
      for (const Span& s : spans)
        if (s.pid == pid && (s.name == "forward" || s.name == "backward") && c.ts >= s.ts && c.ts <= s.ts + s.dur)
          (s.name == "forward" ? in_forward : in_backward)++;
    }
    // Per step 2 layers x 2 all-reduces + the embedding's and the loss's forward, 2 x 2 + the head's backward.
    EXPECT_GE(in_forward, 4) << "rank " << pid << ": tp collectives inside forward";
    EXPECT_GE(in_backward, 4) << "rank " << pid << ": tp collectives inside backward";
  }
}

// Everything at once, 8 ranks (oversubscribed): dp 2 x interleaved pp 2 (2
// chunks per rank: the 4 layers [embedding, block 0, block 1, head] dealt out
// round the ring) x tp 2 with sequence parallelism, the sharded optimizer, and
// its param all-gather overlapped with the next forward. Still one process's run
// (params within kEightRankParamTol, as the 8-rank test above).
TEST(TrainGptParallel, AllAxesInterleavedWithZeroOverlapMatchesOneProcess) {
  expect_same_run(train("all_axes_interleaved", 8,
                        "--dp 2 --pp 2 --virtual-stages 2 --tp 2 --sequence-parallel --microbatches 2 --batch 4 "
                        "--zero --overlap-param-gather"),
                  single_process_batch16(),
                  "--dp 2 --pp 2 --virtual-stages 2 --tp 2 --sequence-parallel --zero --overlap-param-gather", 1e-5,
                  kEightRankParamTol);
}
