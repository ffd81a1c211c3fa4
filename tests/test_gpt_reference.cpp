// loom's GPT against PyTorch (llm.c style). tests/reference/make_reference.py
// built the same model in PyTorch 1.13, float32, and wrote its weights, one
// batch, the logits, the loss and every parameter gradient into
// tests/reference/gpt_reference.safetensors. Here loom loads those weights and
// must reproduce the rest.
//
// "Relative error" of a tensor is max_i |loom_i - ref_i| / max_i |ref_i|: the
// worst absolute error measured against the tensor's scale, so elements near
// zero (many gradient entries) do not blow the ratio up. Tolerances: logits
// and loss 1e-5, gradients 1e-4.
#include <gtest/gtest.h>


#include "nn/gpt.h"
#include "nn/loss.h"
#include "nn/safetensors.h"
#include "tests/reference_check.h"

using namespace loom;
using namespace loom::nn;

namespace {

const std::string kReference = std::string(LOOM_TEST_DATA_DIR) + "/reference/gpt_reference.safetensors";

struct Reference {
  SafetensorsFile file = load_safetensors(kReference);
  GPTConfig cfg;
  NamedTensors weights;

  Reference() {
    auto meta = [&](const char* key) { return std::stoll(file.metadata.at(key)); };
    cfg.vocab_size = meta("vocab_size");
    cfg.block_size = meta("block_size");
    cfg.n_layer = meta("n_layer");
    cfg.n_head = meta("n_head");
    cfg.n_embd = meta("n_embd");
    cfg.dropout = 0.0;
    weights = test::reference_weights(file);
  }
};

}  // namespace

TEST(GPTReference, FileHoldsTheDocumentedConfigAndBatch) {
  Reference ref;
  EXPECT_EQ(ref.cfg.vocab_size, 65);
  EXPECT_EQ(ref.cfg.block_size, 16);
  EXPECT_EQ(ref.cfg.n_layer, 2);
  EXPECT_EQ(ref.cfg.n_head, 2);
  EXPECT_EQ(ref.cfg.n_embd, 32);
  EXPECT_EQ(ref.file.at("idx").shape(), (Shape{4, 16}));
  EXPECT_EQ(ref.file.at("targets").dtype(), kInt64);
  int ignored = 0;  // targets[3, 14:] = -100 exercises ignore_index against PyTorch
  for (int64_t t : ref.file.at("targets").to_vector<int64_t>()) ignored += t == -100;
  EXPECT_EQ(ignored, 2);
  EXPECT_EQ(ref.file.at("logits").shape(), (Shape{4, 16, 65}));
  EXPECT_EQ(ref.file.at("adamw_losses").shape(), (Shape{10}));
  EXPECT_EQ(ref.weights.size(), 28u);  // 2 embeddings + 2 x 12 block tensors + ln_f
}

TEST(GPTReference, LogitsLossAndEveryGradientMatchPyTorch) {
  Reference ref;
  GPT model(ref.cfg);  // its own random init is overwritten by the strict load below
  model.load_state_dict(ref.weights);
  test::expect_forward_backward_match(model, ref.file, 28);
}

// llm.c's check: 10 optimizer steps on the same batch track PyTorch's losses.
// AdamW as in make_reference.py: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight
// decay 0.1 on the matmul weights only (train_gpt's grouping).
TEST(GPTReference, TenAdamWStepsMatchPyTorchLosses) {
  Reference ref;
  GPT model(ref.cfg);
  model.load_state_dict(ref.weights);
  test::expect_adamw_losses_match(model, ref.file, 8u);  // 4 matmul weights x 2 blocks
}
