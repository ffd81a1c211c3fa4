// The Llama blocks (train_gpt --arch llama: RMSNorm, RoPE at base 500000,
// SwiGLU, grouped-query attention with 2 kv heads for 4 query heads, an untied
// head) in every parallel mode that supports them, against the single process
// on the same global batch: per-step losses, grad norms and final parameters
// within 1e-5 relative, as test_train_gpt_parallel.cpp does for GPT-2's blocks
// (tests/train_gpt_run.h explains the tolerances and how runs are launched).
// Tensor parallelism splits the q heads and the kv heads over tp; kv heads
// that do not split are refused before training.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "tests/train_gpt_run.h"

using namespace loom;
using namespace loom::test;

namespace {

// Appended after train()'s common flags: the last --heads wins.
const std::string kLlama = " --arch llama --heads 4 --kv-heads 2 --rope-base 500000 ";

const Result& llama_single_process() {
  static Result r = train("llama_single", 1, kLlama + "--batch 16");
  return r;
}

}  // namespace

TEST(TrainLlamaParallel, SingleProcessRunHasTheLlamaParameters) {
  const Result& r = llama_single_process();
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(r.weights.contains("lm_head.weight"));             // untied
  EXPECT_TRUE(r.weights.contains("blocks.1.mlp.c_gate.weight"));  // SwiGLU
  EXPECT_FALSE(r.weights.contains("wpe.weight"));                 // RoPE instead
  EXPECT_FALSE(r.weights.contains("blocks.0.ln_1.bias"));         // RMSNorm, no biases
  EXPECT_EQ(r.weights.at("blocks.0.attn.c_attn.weight").shape(), (Shape{32 + 2 * 2 * 8, 32}));  // 2 kv heads of 8
  EXPECT_LT(r.losses.back(), r.losses.front());
}

TEST(TrainLlamaParallel, BucketDataParallelTwoRanksMatchesOneProcess) {
  expect_same_run(train("llama_dp2", 2, kLlama + "--dp 2 --batch 8"), llama_single_process(), "llama --dp 2");
}

TEST(TrainLlamaParallel, NaiveDataParallelTwoRanksMatchesOneProcess) {
  expect_same_run(train("llama_naive_dp2", 2, kLlama + "--dp 2 --dp-mode naive --batch 8"), llama_single_process(),
                  "llama --dp 2 naive");
}

// Interleaved 1F1B: 4 layers (embedding, 2 blocks, head) in 4 chunks, 2 per stage.
TEST(TrainLlamaParallel, InterleavedPipelineMatchesOneProcess) {
  expect_same_run(train("llama_pp2_v2", 2, kLlama + "--pp 2 --virtual-stages 2 --microbatches 4 --batch 4"),
                  llama_single_process(), "llama --pp 2 --virtual-stages 2");
}

TEST(TrainLlamaParallel, PipelineTwoStagesMatchesOneProcess) {
  expect_same_run(train("llama_pp2", 2, kLlama + "--pp 2 --microbatches 4 --batch 4"), llama_single_process(),
                  "llama --pp 2 1f1b");
}

TEST(TrainLlamaParallel, AfabPipelineMatchesOneProcess) {
  expect_same_run(train("llama_pp2_afab", 2, kLlama + "--pp 2 --schedule afab --microbatches 4 --batch 4"),
                  llama_single_process(), "llama --pp 2 afab");
}

TEST(TrainLlamaParallel, ZeroTwoRanksMatchesOneProcess) {
  expect_same_run(train("llama_zero_dp2", 2, kLlama + "--dp 2 --batch 8 --zero"), llama_single_process(),
                  "llama --dp 2 --zero");
}

// bf16 weights and activations, fp32 main params (the bound of
// test_train_gpt_parallel's Bf16TracksFp32, 1e-3).
TEST(TrainLlamaParallel, Bf16TracksFp32) {
  Result bf16 = train("llama_bf16_zero_dp2", 2, kLlama + "--dp 2 --batch 8 --zero --dtype bf16");
  ASSERT_EQ(bf16.status, 0) << bf16.output;
  const Result& fp32 = llama_single_process();
  ASSERT_EQ(fp32.status, 0) << fp32.output;
  double worst = 0;
  for (size_t i = 0; i < 10; ++i) worst = std::max(worst, std::abs(bf16.losses[i] - fp32.losses[i]) / fp32.losses[i]);
  EXPECT_LE(worst, 1e-3);
  EXPECT_GT(worst, 0.0);  // bf16 did run in bf16
  std::printf("[ measured ] llama bf16 (--dp 2 --zero) vs fp32: worst loss rel. difference %.2e\n", worst);
}

// tp 2: each rank 2 query heads and the 1 kv head they share, half of
// SwiGLU's gate and up columns, half of the down projection's rows, half of
// lm_head's vocabulary rows.
TEST(TrainLlamaParallel, TensorParallelTwoRanksMatchesOneProcess) {
  expect_same_run(train("llama_tp2", 2, kLlama + "--tp 2 --batch 16"), llama_single_process(), "llama --tp 2");
}

TEST(TrainLlamaParallel, TensorParallelWithSequenceParallelMatchesOneProcess) {
  expect_same_run(train("llama_tp2_sp", 2, kLlama + "--tp 2 --sequence-parallel --batch 16"), llama_single_process(),
                  "llama --tp 2 --sequence-parallel");
}

TEST(TrainLlamaParallel, KvHeadsThatDoNotSplitOverTpAreRefused) {
  Result r = train("llama_tp2_mqa", 2, kLlama + "--kv-heads 1 --tp 2 --batch 16");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--tp 2 must divide the key/value heads (--kv-heads 1)"), std::string::npos) << r.output;
}

TEST(TrainLlamaParallel, KvHeadsThatDoNotDivideTheHeadsAreRefused) {
  Result r = train("llama_bad_kv", 1, kLlama + "--kv-heads 3 --batch 16");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--kv-heads 3 must divide --heads 4"), std::string::npos) << r.output;
}

// A checkpoint carries the architecture (nn/arch_metadata.h): saved at
// step 5 by a tp 2 run, resumed on a 2-stage pipeline with no --arch flag
// (GPT-2's default), it must go on as the Llama single process does.
TEST(TrainLlamaParallel, CheckpointKeepsTheArchitectureAcrossAReshard) {
  Result first = train("llama_reshard", 2, kLlama + "--tp 2 --batch 16 --stop-at 5");
  ASSERT_EQ(first.status, 0) << first.output;
  Result resumed = train("llama_reshard", 2, "--pp 2 --microbatches 4 --batch 4 --resume " + checkpoint("llama_reshard"));
  EXPECT_NE(resumed.output.find("architecture: llama: RMSNorm, RoPE base 500000"), std::string::npos) << resumed.output;
  expect_same_run(resumed, llama_single_process(), "llama --tp 2 -> save -> --pp 2");
}

// An --arch that is not the checkpoint's is refused before training, naming
// both: a resume trains the checkpoint's architecture (under --arch llama it
// used to train the GPT-2 checkpoint, without a word). The checkpoint's own
// --arch, given, is fine.
TEST(TrainLlamaParallel, ResumeUnderAnotherArchIsRefusedNamingBoth) {
  Result first = train("gpt2_then_llama", 1, "--batch 16 --stop-at 5");
  ASSERT_EQ(first.status, 0) << first.output;
  Result r = train("gpt2_then_llama", 1, kLlama + "--batch 16 --resume " + checkpoint("gpt2_then_llama"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--arch llama, but the checkpoint --resume " + checkpoint("gpt2_then_llama") +
                          " holds a gpt2 model, and a resume trains the checkpoint's architecture; drop --arch or "
                          "pass --arch gpt2"),
            std::string::npos)
      << r.output;
  Result same = train("gpt2_then_llama", 1, "--arch gpt2 --batch 16 --resume " + checkpoint("gpt2_then_llama"));
  EXPECT_EQ(same.status, 0) << same.output;
  // The same flags again resume: --arch gpt2 --untied is a "custom" model, as its checkpoint says (the
  // combination sweep found this refused).
  ASSERT_EQ(train("untied", 1, "--arch gpt2 --untied --batch 16 --stop-at 5").status, 0);
  Result untied = train("untied", 1, "--arch gpt2 --untied --batch 16 --resume " + checkpoint("untied"));
  EXPECT_EQ(untied.status, 0) << untied.output;
}
