// loom's Llama blocks against PyTorch (llm.c style, as test_gpt_reference.cpp
// for GPT-2's). tests/reference/make_llama_reference.py built the same model in
// plain PyTorch (torch_llama.py: RMSNorm, RoPE base 500000 in transformers'
// rotate-half layout, grouped-query attention with 2 kv heads for 4 query
// heads, SwiGLU, no biases, an untied lm_head) and wrote its weights, one
// batch, the logits, the loss, every gradient and 10 AdamW losses into
// tests/reference/llama_reference.safetensors. loom loads the weights and must
// reproduce the rest: logits, loss and AdamW losses to 1e-5 relative,
// gradients to 1e-4 (relative to each tensor's largest entry).
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
#include "optim/adamw.h"
#include "optim/param_groups.h"

using namespace loom;
using namespace loom::nn;

namespace {

const std::string kReference = std::string(LOOM_TEST_DATA_DIR) + "/reference/llama_reference.safetensors";
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
    auto meta = [&](const char* key) { return std::stod(file.metadata.at(key)); };
    cfg.vocab_size = int64_t(meta("vocab_size"));
    cfg.block_size = int64_t(meta("block_size"));
    cfg.n_layer = int64_t(meta("n_layer"));
    cfg.n_head = int64_t(meta("n_head"));
    cfg.n_embd = int64_t(meta("n_embd"));
    cfg.set_arch(file.metadata.at("arch"));
    cfg.n_kv_head = int64_t(meta("n_kv_head"));
    cfg.mlp_hidden = int64_t(meta("mlp_hidden"));
    cfg.rope_base = meta("rope_base");
    cfg.norm_eps = meta("norm_eps");
    for (const auto& [name, t] : file.tensors)
      if (!kNotWeights.count(name) && name.rfind("grad.", 0) != 0) weights.emplace_back(name, t);
  }
};

}  // namespace

TEST(LlamaReference, FileHoldsGroupedQueryRoPEAndAnUntiedHead) {
  Reference ref;
  EXPECT_EQ(ref.cfg.arch(), "llama");
  EXPECT_EQ(ref.cfg.n_head, 4);
  EXPECT_EQ(ref.cfg.n_kv_head, 2);       // grouped-query: 2 query heads per kv head
  EXPECT_EQ(ref.cfg.rope_base, 500000);  // not the default 10000
  EXPECT_EQ(ref.cfg.ffn_hidden(), 88);   // loom's default SwiGLU width for C = 32: 8C/3 rounded up to 8
  // wte, 2 x (ln_1, c_attn, c_proj, ln_2, c_gate, c_fc, c_proj), ln_f, lm_head
  EXPECT_EQ(ref.weights.size(), 17u);
  EXPECT_EQ(ref.file.at("blocks.0.attn.c_attn.weight").shape(), (Shape{32 + 2 * 2 * 8, 32}));
  GPT model(ref.cfg);
  int64_t n = 0;
  for (const auto& [name, p] : model.named_parameters()) n += p.numel();
  EXPECT_EQ(n, gpt_embedding_params(ref.cfg) + 2 * gpt_block_params(ref.cfg) + gpt_head_params(ref.cfg));
  EXPECT_EQ(n, 27360);  // make_llama_reference.py's count
}

TEST(LlamaReference, LogitsLossAndEveryGradientMatchPyTorch) {
  Reference ref;
  GPT model(ref.cfg);
  model.load_state_dict(ref.weights);  // strict: every name and shape must match

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
  EXPECT_EQ(compared, 17);
  std::printf("[ measured ] logits %.2e, loss %.2e, worst gradient %.2e (%s)\n", logits_err, loss_err, worst,
              worst_name.c_str());
}

TEST(LlamaReference, TenAdamWStepsMatchPyTorchLosses) {
  Reference ref;
  GPT model(ref.cfg);
  model.load_state_dict(ref.weights);
  optim::AdamW opt(optim::gpt_param_groups(model, 1e-3, 0.1));
  ASSERT_EQ(opt.param_groups()[0].params.size(), 11u);  // 5 matrices x 2 blocks + lm_head
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
  EXPECT_LT(expected.back(), expected.front());
  std::printf("[ measured ] 10 AdamW losses: worst relative error %.2e\n", worst);
}
