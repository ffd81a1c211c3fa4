// train_gpt --experts in one process (nn/moe.h): gradient accumulation equals
// one micro-batch, the aux losses' gradient counts once per step whatever the
// micro-batch count and fp16's loss scale, resume is bit-exact with every
// routing option on, the log reports the dropped fraction, and what is not
// equal to one process yet is refused before training, naming the flag.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "train_gpt_run.h"

using namespace loom;
using namespace loom::test;

namespace {

const std::string kMoE = " --arch llama --experts 4 --experts-per-token 2 ";

}  // namespace

// Dropless routing is per token, so 2 micro-batches of 4 sequences route as one of 8 does; the experts'
// gradients are summed over micro-batches like every other weight's.
TEST(TrainGptMoE, GradAccumEqualsOneMicroBatchWhenDropless) {
  const Result one = train("moe_b8", 1, kMoE + "--shared-experts 1 --batch 8");
  const Result two = train("moe_b4x2", 1, kMoE + "--shared-experts 1 --batch 4 --grad-accum 2");
  expect_same_run(two, one, "--batch 4 --grad-accum 2 against --batch 8");
}

// Over a corpus of one character every sequence is the same, so every micro-batch is too and the
// cross-entropy is 0: the gradient is the aux and z losses' alone. Its mean over 2 micro-batches is one
// micro-batch's (the aux loss scaled by 1 / micro-batches, as the main loss is: nn/moe_aux_loss.h), and
// under fp16 it is unscaled as the main loss's is (else 65536 times too small).
TEST(TrainGptMoE, AuxLossGradientCountsOncePerStepWhateverTheMicroBatchesAndLossScale) {
  const fs::path corpus = work_dir() / "one_char.txt";
  std::ofstream(corpus) << std::string(3000, 'a');
  const std::string aux = kMoE + "--router-aux-loss-coef 0.5 --router-z-loss-coef 0.1 --batch 4 --data " +
                          corpus.string() + " ";
  const Result k1 = train("moe_aux_k1", 1, aux, false), k2 = train("moe_aux_k2", 1, aux + "--grad-accum 2", false),
               fp16 = train("moe_aux_fp16", 1, aux + "--dtype fp16 --loss-scale 256", false);
  for (const Result* r : {&k1, &k2, &fp16}) ASSERT_EQ(r->status, 0) << r->output;
  ASSERT_EQ(k1.grad_norms.size(), 10u);
  ASSERT_EQ(fp16.grad_norms.size(), 10u);
  EXPECT_EQ(k1.losses[0], 0.0);
  EXPECT_GT(k1.grad_norms[0], 1.0);
  for (size_t i = 0; i < 10; ++i)
    EXPECT_NEAR(k2.grad_norms[i], k1.grad_norms[i], 1e-6 * k1.grad_norms[i]) << "step " << i;
  // fp16: the first step's gradient, from the same weights (later steps part by fp16's rounding)
  EXPECT_EQ(field(fp16.log[0], "loss_scale"), 256.0);
  EXPECT_NEAR(fp16.grad_norms[0], k1.grad_norms[0], 1e-2 * k1.grad_norms[0]);
}

// Every routing option on (shared experts, a capacity that drops, the aux and z losses, DeepSeek-V3's
// bias): 10 steps straight, or 5, save, resume, 5: the same bits. The biases are in the model file
// (nn/moe_bias_state.h), so the weights compared below include them.
TEST(TrainGptMoE, ResumeIsBitExact) {
  const std::string flags = kMoE + "--shared-experts 1 --capacity-factor 1.0 --router-aux-loss-coef 0.02 "
                                   "--router-z-loss-coef 0.001 --router-bias-update-rate 0.01 --batch 4 ";
  const Result straight = train("moe_straight", 1, flags);
  const Result first = train("moe_first", 1, flags + "--stop-at 5");
  ASSERT_EQ(first.status, 0) << first.output;
  const Result resumed = train("moe_resumed", 1, flags + "--resume " + checkpoint("moe_first"));
  ASSERT_EQ(straight.status, 0) << straight.output;
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  ASSERT_EQ(straight.losses.size(), 10u);
  ASSERT_EQ(resumed.losses.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(first.log[i].substr(0, first.log[i].find("\"tokens_per_s\"")),
              straight.log[i].substr(0, straight.log[i].find("\"tokens_per_s\"")));
    EXPECT_EQ(resumed.losses[i], straight.losses[5 + i]) << "step " << 5 + i;
    EXPECT_EQ(resumed.grad_norms[i], straight.grad_norms[5 + i]) << "step " << 5 + i;
  }
  for (const auto& [name, t] : straight.weights.tensors)
    EXPECT_EQ(resumed.weights.at(name).to_vector<float>(), t.to_vector<float>()) << name;
  // The biases moved (5 steps of +-0.01 each) and were saved, one per layer.
  for (const std::string name : {"blocks.0.moe.score_bias", "blocks.1.moe.score_bias"}) {
    ASSERT_TRUE(first.weights.contains(name)) << name;
    const std::vector<float> b = first.weights.at(name).to_vector<float>();
    ASSERT_EQ(b.size(), 4u);
    EXPECT_GT(*std::max_element(b.begin(), b.end()) - *std::min_element(b.begin(), b.end()), 0.015f) << name;
  }
}

// A checkpoint without the biases (saved without --router-bias-update-rate) resumes with them at 0: its
// first step routes as the run without the bias did (the bias moves only after a step), later ones do
// not. The other way, a checkpoint with biases resumed without the flag, is refused before training.
TEST(TrainGptMoE, ResumeWithoutSavedBiasesStartsThemAtZero) {
  const std::string flags = kMoE + "--batch 4 ";
  const Result plain = train("moe_nobias_straight", 1, flags);
  ASSERT_EQ(train("moe_nobias_first", 1, flags + "--stop-at 5").status, 0);
  const Result biased = train("moe_nobias_resumed", 1, flags + "--router-bias-update-rate 0.05 --resume " +
                                                         checkpoint("moe_nobias_first"));
  ASSERT_EQ(plain.status, 0) << plain.output;
  ASSERT_EQ(biased.status, 0) << biased.output;
  EXPECT_NE(biased.output.find("has no routing biases (blocks.0.moe.score_bias ...; saved without "
                               "--router-bias-update-rate): they start at 0"), std::string::npos) << biased.output;
  ASSERT_EQ(biased.losses.size(), 5u);
  EXPECT_EQ(biased.losses[0], plain.losses[5]);
  bool parted = false;
  for (size_t i = 1; i < 5; ++i) parted = parted || biased.losses[i] != plain.losses[5 + i];
  EXPECT_TRUE(parted) << "the bias never changed a choice";

  ASSERT_EQ(train("moe_bias_first", 1, flags + "--router-bias-update-rate 0.05 --stop-at 5").status, 0);
  const Result dropped = train("moe_bias_dropped", 1, flags + "--resume " + checkpoint("moe_bias_first"), false);
  EXPECT_NE(dropped.status, 0);
  EXPECT_NE(dropped.output.find("holds the routing biases of a --router-bias-update-rate run (blocks.0.moe.score_bias"
                                " ...): without the flag"), std::string::npos) << dropped.output;
  EXPECT_EQ(dropped.output.find("| loss "), std::string::npos) << "trained before refusing:\n" << dropped.output;
}

// capacity = ceil(F N k / E) rows per expert: at F 0.5 at most half the slots are kept.
TEST(TrainGptMoE, LogReportsTheDroppedFractionAndTheBalance) {
  const Result dropping = train("moe_capacity", 1, kMoE + "--capacity-factor 0.5 --batch 4", false);
  const Result dropless = train("moe_dropless", 1, kMoE + "--batch 4", false);
  ASSERT_EQ(dropping.status, 0) << dropping.output;
  ASSERT_EQ(dropless.status, 0) << dropless.output;
  for (const std::string& line : dropping.log) {
    EXPECT_GE(field(line, "moe_dropped"), 0.5) << line;  // N = 4 x 16 tokens, k 2, E 4: 4 x 16 of 128 slots kept
    EXPECT_LT(field(line, "moe_dropped"), 1.0) << line;
  }
  for (const std::string& line : dropless.log) {
    EXPECT_EQ(field(line, "moe_dropped"), 0.0) << line;
    EXPECT_GE(field(line, "moe_balance"), 2.0 - 1e-6) << line;  // E sum f P >= k = 2 (its minimum, a uniform router)
    EXPECT_GE(field(line, "moe_max_load"), 1.0) << line;
  }
  EXPECT_NE(dropping.output.find("dropped "), std::string::npos) << dropping.output;
}

TEST(TrainGptMoE, WhatIsNotEqualToOneProcessYetIsRefusedBeforeTraining) {
  const std::pair<std::string, std::string> cases[] = {
      {"--experts 4", "--experts 4 with --arch gpt2: the experts are SwiGLU MLPs"},
      {"--capacity-factor 1.0", "--capacity-factor tunes a mixture of experts; it needs --experts E"},
      {"--router-aux-loss-coef 0.01", "--router-aux-loss-coef tunes a mixture of experts"},
      {kMoE + "--experts-per-token 5", "--experts-per-token 5 is more than --experts 4"},
      // --memory-report's formula (tests/test_memory_ledger_moe.cpp): interleaved --recompute full with --ep or a
      // capacity under ZeRO-3 without reshard after forward
      {kMoE + "--dp 2 --ep 2 --pp 2 --virtual-stages 2 --layers 4 --recompute full --zero 3 "
              "--zero3-reshard-after-forward off --memory-report",
       "--memory-report with --experts 4, --ep 2, --virtual-stages 2, --recompute full, --zero 3 and "
       "--zero3-reshard-after-forward off: "},
      {kMoE + "--router-bias-update-rate 0.01 --export-hf " + (work_dir() / "moe_bias_hf").string(),
       "--export-hf with --router-bias-update-rate 0.01: transformers' MixtralForCausalLM routes without a bias"},
      // On a GPU, one process, --dp and --ep only (tests/cuda/); refused before any device is opened.
      {kMoE + "--device cuda --tp 2", "--experts 4 with --device cuda and --tp 2: on a GPU a mixture of experts "
                                      "trains in one process or under --dp and --ep"},
      {kMoE + "--device cuda --dp 2 --ep 2 --zero 2", "--experts 4 with --device cuda and --zero 2: "},
      {kMoE + "--device cuda --memory-report", "--experts 4 with --device cuda and --memory-report: "}};
  for (const auto& [flags, want] : cases) {
    const Result r = train("moe_refused", 1, flags, false);
    EXPECT_NE(r.status, 0) << flags;
    EXPECT_NE(r.output.find(want), std::string::npos) << flags << "\n" << r.output;
    EXPECT_EQ(r.output.find("| loss "), std::string::npos) << flags << ": trained before refusing\n" << r.output;
  }
  // A checkpoint with experts, resumed with no --experts flag: still refused under what the experts refuse.
  // (Its shared experts too: no Hugging Face class reads them.)
  ASSERT_EQ(train("moe_ckpt", 1, kMoE + "--shared-experts 1 --batch 4 --stop-at 1").status, 0);
  const Result resumed = train("moe_refused_resume", 1, "--export-hf " + (work_dir() / "moe_shared_hf").string() +
                                                            " --resume " + checkpoint("moe_ckpt"), false);
  EXPECT_NE(resumed.status, 0);
  EXPECT_NE(resumed.output.find("has 4 experts per block: --export-hf with --shared-experts 1: "),
            std::string::npos) << resumed.output;
  EXPECT_EQ(resumed.output.find("| loss "), std::string::npos) << "trained before refusing:\n" << resumed.output;
}
