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

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "autograd/engine.h"
#include "autograd/variable.h"
#include "nn/gpt.h"
#include "nn/loss.h"
#include "nn/safetensors.h"
#include "optim/param_groups.h"
#include "optim/adamw.h"

using namespace loom;
using namespace loom::nn;

namespace {

const std::string kReference = std::string(LOOM_TEST_DATA_DIR) + "/reference/gpt_reference.safetensors";
// The entries of the file that are not model weights.
const std::set<std::string> kNotWeights = {"idx", "targets", "logits", "loss", "adamw_losses"};

double relative_error(const Tensor& got, const Tensor& ref) {
  EXPECT_EQ(got.shape(), ref.shape());
  std::vector<double> a = got.to_vector<double>(), b = ref.to_vector<double>();
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(a[i] - b[i]));
    max_ref = std::max(max_ref, std::abs(b[i]));
  }
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

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
    for (const auto& [name, t] : file.tensors)
      if (!kNotWeights.count(name) && name.rfind("grad.", 0) != 0) weights.emplace_back(name, t);
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

  Tensor logits = model.forward(ref.file.at("idx"));
  Tensor loss = cross_entropy_loss(logits, ref.file.at("targets"));
  const double logits_err = relative_error(logits, ref.file.at("logits"));
  const double loss_err = relative_error(loss, ref.file.at("loss"));
  EXPECT_LE(logits_err, 1e-5);
  EXPECT_LE(loss_err, 1e-5);

  autograd::backward(loss);
  double worst = 0;
  std::string worst_name;
  int compared = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    ASSERT_TRUE(ref.file.contains("grad." + name)) << "the reference has no gradient for " << name;
    Tensor g = autograd::grad(p);
    ASSERT_TRUE(g.defined()) << name << " got no gradient";
    const double err = relative_error(g, ref.file.at("grad." + name));
    EXPECT_LE(err, 1e-4) << "gradient of " << name;
    if (err > worst) worst = err, worst_name = name;
    ++compared;
  }
  EXPECT_EQ(compared, 28);
  std::printf("[ measured ] logits %.2e, loss %.2e, worst gradient %.2e (%s)\n", logits_err, loss_err, worst,
              worst_name.c_str());
}

// llm.c's check: 10 optimizer steps on the same batch track PyTorch's losses.
// AdamW as in make_reference.py: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight
// decay 0.1 on the matmul weights only (train_gpt's grouping).
TEST(GPTReference, TenAdamWStepsMatchPyTorchLosses) {
  Reference ref;
  GPT model(ref.cfg);
  model.load_state_dict(ref.weights);
  optim::AdamW opt(optim::gpt_param_groups(model, 1e-3, 0.1));
  ASSERT_EQ(opt.param_groups()[0].params.size(), 8u);  // 4 matmul weights x 2 blocks
  std::vector<double> expected = ref.file.at("adamw_losses").to_vector<double>();
  ASSERT_EQ(expected.size(), 10u);
  double worst = 0;
  for (size_t step = 0; step < 10; ++step) {
    Tensor loss = cross_entropy_loss(model.forward(ref.file.at("idx")), ref.file.at("targets"));
    double got = loss.item<double>();
    double rel = std::abs(got - expected[step]) / std::abs(expected[step]);
    EXPECT_LE(rel, 1e-5) << "step " << step << ": loom " << got << ", PyTorch " << expected[step];
    worst = std::max(worst, rel);
    autograd::backward(loss);
    opt.step();
    opt.zero_grad();
  }
  EXPECT_LT(expected.back(), expected.front());  // the reference itself learned something
  std::printf("[ measured ] 10 AdamW losses: worst relative error %.2e\n", worst);
}
