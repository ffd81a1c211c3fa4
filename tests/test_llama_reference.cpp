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


#include "nn/gpt.h"
#include "nn/loss.h"
#include "nn/safetensors.h"
#include "tests/reference_check.h"

using namespace loom;
using namespace loom::nn;

namespace {

const std::string kReference = std::string(LOOM_TEST_DATA_DIR) + "/reference/llama_reference.safetensors";

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
    weights = test::reference_weights(file);
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
  test::expect_forward_backward_match(model, ref.file, 17);
}

TEST(LlamaReference, TenAdamWStepsMatchPyTorchLosses) {
  Reference ref;
  GPT model(ref.cfg);
  model.load_state_dict(ref.weights);
  test::expect_adamw_losses_match(model, ref.file, 11u);  // 5 matrices x 2 blocks + lm_head
}
