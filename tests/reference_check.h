// The checks of a GPT against a PyTorch reference file (tests/reference/,
// llm.c's test_gpt2): logits, loss and every gradient, then 10 AdamW steps'
// losses, for any architecture the file was written for (test_gpt_reference.cpp:
// GPT-2; test_llama_reference.cpp: Llama). The file holds "idx", "targets",
// "logits", "loss", "grad.<name>" for each parameter and "adamw_losses".
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/variable.h"
#include "nn/gpt.h"
#include "nn/loss.h"
#include "nn/safetensors.h"
#include "optim/adamw.h"
#include "optim/param_groups.h"
#include "relative_error.h"

namespace loom::test {

// The model weights of a reference file: every entry but the batch, the
// outputs and the "grad." entries.
inline nn::NamedTensors reference_weights(const nn::SafetensorsFile& file) {
  static const char* const not_weights[] = {"idx", "targets", "logits", "loss", "adamw_losses"};
  nn::NamedTensors weights;
  for (const auto& [name, t] : file.tensors)
    if (std::find(std::begin(not_weights), std::end(not_weights), name) == std::end(not_weights) &&
        name.rfind("grad.", 0) != 0)
      weights.emplace_back(name, t);
  return weights;
}

// Logits and loss within 1e-5, each of the model's `params` gradients within
// 1e-4 of the reference's; prints the errors.
inline void expect_forward_backward_match(nn::GPT& model, const nn::SafetensorsFile& file, int params) {
  Tensor logits = model.forward(file.at("idx"));
  Tensor loss = nn::cross_entropy_loss(logits, file.at("targets"));
  const double logits_err = relative_error(logits, file.at("logits"));
  const double loss_err = relative_error(loss, file.at("loss"));
  EXPECT_LE(logits_err, 1e-5);
  EXPECT_LE(loss_err, 1e-5);

  autograd::backward(loss);
  double worst = 0;
  std::string worst_name;
  int compared = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    ASSERT_TRUE(file.contains("grad." + name)) << "the reference has no gradient for " << name;
    Tensor g = autograd::grad(p);
    ASSERT_TRUE(g.defined()) << name << " got no gradient";
    const double err = relative_error(g, file.at("grad." + name));
    EXPECT_LE(err, 1e-4) << "gradient of " << name;
    if (err > worst) worst = err, worst_name = name;
    ++compared;
  }
  EXPECT_EQ(compared, params);
  std::printf("[ measured ] logits %.2e, loss %.2e, worst gradient %.2e (%s)\n", logits_err, loss_err, worst,
              worst_name.c_str());
}

// llm.c's check: 10 AdamW steps on the same batch track the reference's losses
// within 1e-5 relative (lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.1
// on the matmul weights only: train_gpt's grouping). decayed: how many params
// that group holds.
inline void expect_adamw_losses_match(nn::GPT& model, const nn::SafetensorsFile& file, size_t decayed) {
  optim::AdamW opt(optim::gpt_param_groups(model, 1e-3, 0.1));
  ASSERT_EQ(opt.param_groups()[0].params.size(), decayed);
  std::vector<double> expected = file.at("adamw_losses").to_vector<double>();
  ASSERT_EQ(expected.size(), 10u);
  double worst = 0;
  for (size_t step = 0; step < 10; ++step) {
    Tensor loss = nn::cross_entropy_loss(model.forward(file.at("idx")), file.at("targets"));
    const double got = loss.item<double>();
    const double rel = std::abs(got - expected[step]) / std::abs(expected[step]);
    EXPECT_LE(rel, 1e-5) << "step " << step << ": loom " << got << ", PyTorch " << expected[step];
    worst = std::max(worst, rel);
    autograd::backward(loss);
    opt.step();
    opt.zero_grad();
  }
  EXPECT_LT(expected.back(), expected.front());
  std::printf("[ measured ] 10 AdamW losses: worst relative error %.2e\n", worst);
}

}  // namespace loom::test
