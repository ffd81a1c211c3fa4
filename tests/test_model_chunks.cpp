// The model's layer chunks on one process (parallel/model_chunks.h): a pipeline stage builds only
// its own layers (its parameter memory, read from the allocator, is its
// layers' and nothing more), its parameters carry the full model's names and
// values, and two stages chained by hand - forward, then backward from the
// received gradient - reproduce the full GPT's logits, loss and gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/variable.h"
#include "nn/gpt.h"
#include "nn/loss.h"
#include "parallel/model_chunks.h"
#include "tensor/ops.h"
#include "relative_error.h"

using namespace loom;
using loom::test::relative_error;
using namespace loom::parallel;

namespace {

// V 32, block 16, 4 blocks, 2 heads, C 32: 6 layers [embedding, 4 blocks, head].
const nn::GPTConfig kCfg{32, 16, 4, 2, 32, 0.0, 11};

std::vector<std::string> names(const nn::Module& m) {
  std::vector<std::string> out;
  for (auto& [n, p] : m.named_parameters()) out.push_back(n);
  return out;
}

std::vector<std::string> block_names(int i) {
  std::vector<std::string> out;
  for (const char* s : {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                        "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                        "mlp.c_proj.weight", "mlp.c_proj.bias"})
    out.push_back("blocks." + std::to_string(i) + "." + s);
  return out;
}

}  // namespace

TEST(ModelChunks, ParameterNamesAreTheFullModelsNames) {
  ModelChunks first(kCfg, {0, 2}), middle(kCfg, {2, 4}), last(kCfg, {4, 6});
  std::vector<std::string> want_first{"wte.weight", "wpe.weight"}, want_middle, want_last;
  for (auto& n : block_names(0)) want_first.push_back(n);
  for (int i : {1, 2})
    for (auto& n : block_names(i)) want_middle.push_back(n);
  for (auto& n : block_names(3)) want_last.push_back(n);
  for (const char* n : {"ln_f.weight", "ln_f.bias", "wte.weight"}) want_last.push_back(n);  // the head's copy
  EXPECT_EQ(names(first), want_first);
  EXPECT_EQ(names(middle), want_middle);
  EXPECT_EQ(names(last), want_last);
  EXPECT_TRUE(first.is_first_stage() && !first.is_last_stage());
  EXPECT_TRUE(!middle.is_first_stage() && !middle.is_last_stage() && !middle.embedding_weight().defined());
  EXPECT_TRUE(last.is_last_stage() && last.embedding_weight().defined());

  // One stage holding everything is the whole model, with a single (tied) wte.
  ModelChunks all(kCfg, {0, 6});
  nn::GPT gpt(kCfg);
  EXPECT_EQ(names(all), names(gpt));
}

// Virtual stages: rank 0 of pp 2 x v 3 over the 6 layers holds layers 0, 2
// and 4, rank 1 layers 1, 3 and 5. Names stay the full model's, in layer
// order; forward(x, c) runs chunk c alone; the embedding and the head are
// wherever their chunk is.
TEST(ModelChunks, ChunksKeepTheModelsNamesAndRunOneAtATime) {
  ModelChunks rank0(kCfg, std::vector<LayerRange>{{0, 1}, {2, 3}, {4, 5}});
  ModelChunks rank1(kCfg, std::vector<LayerRange>{{1, 2}, {3, 4}, {5, 6}});
  std::vector<std::string> want0{"wte.weight", "wpe.weight"}, want1;
  for (int i : {1, 3})
    for (auto& n : block_names(i)) want0.push_back(n);
  for (int i : {0, 2})
    for (auto& n : block_names(i)) want1.push_back(n);
  for (const char* n : {"ln_f.weight", "ln_f.bias", "wte.weight"}) want1.push_back(n);
  EXPECT_EQ(names(rank0), want0);
  EXPECT_EQ(names(rank1), want1);
  EXPECT_EQ(rank0.num_chunks(), 3);
  EXPECT_TRUE(rank0.is_first_stage() && !rank0.is_last_stage() && rank0.chunk_is_first(0) && !rank0.chunk_is_first(1));
  EXPECT_TRUE(rank1.is_last_stage() && rank1.chunk_is_last(2) && !rank1.chunk_is_last(1));

  // The six chunks in virtual-stage order are the whole model (each output
  // detached, as a transfer to the next virtual stage would leave it).
  nn::GPT gpt(kCfg);
  Generator g(3);
  Tensor x = randint(0, 32, {2, 16}, g);
  Tensor h = x;
  for (int c = 0; c < 3; ++c) h = autograd::detach(rank1.forward(autograd::detach(rank0.forward(h, c)), c));
  EXPECT_LE(relative_error(h, gpt.forward(x)), 1e-6);
}

TEST(ModelChunks, ParametersEqualTheFullModels) {
  nn::GPT gpt(kCfg);
  std::map<std::string, Tensor> full;
  for (auto& [n, p] : gpt.named_parameters()) full[n] = p;
  for (LayerRange r : {LayerRange{0, 2}, LayerRange{2, 4}, LayerRange{4, 6}}) {
    ModelChunks stage(kCfg, r);
    for (auto& [n, p] : stage.named_parameters())
      EXPECT_EQ(p.to_vector<float>(), full.at(n).to_vector<float>()) << n;
  }
}

// Stage 0 of a V holds the embedding and the head in two chunks: the head
// uses the embedding's wte, one tensor under one name, as in nn::GPT.
TEST(ModelChunks, BothEndsInAVShareOneTiedEmbedding) {
  ModelChunks stage(kCfg, std::vector<LayerRange>{{0, 1}, {5, 6}});
  EXPECT_EQ(names(stage), (std::vector<std::string>{"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"}));
  const auto& head = static_cast<const nn::HeadLayer&>(*stage.layers().back());
  EXPECT_EQ(head.token_embedding().impl(), stage.embedding_weight().impl());
  nn::GPTConfig untied = kCfg;
  untied.tied_embeddings = false;
  ModelChunks own_head(untied, std::vector<LayerRange>{{0, 1}, {5, 6}});
  EXPECT_EQ(names(own_head).back(), "lm_head.weight");
}

TEST(ModelChunks, BuildsOnlyItsOwnLayers) {
  // Parameter counts, by hand: V C + block C = 1536, a block 12 C² + 13 C = 12704, the head 2 C + V C = 1088.
  const int64_t emb = 32 * 32 + 16 * 32, block = 12 * 32 * 32 + 13 * 32, head = 2 * 32 + 32 * 32;
  struct Case {
    LayerRange range;
    int64_t params;
  };
  for (Case c : {Case{{0, 2}, emb + block}, Case{{2, 4}, 2 * block}, Case{{4, 6}, block + head},
                 Case{{0, 6}, emb + 4 * block + 2 * 32}}) {  // the whole model: wte counted once
    const int64_t before = memory_stats().live_bytes;
    auto stage = std::make_shared<ModelChunks>(kCfg, c.range);
    const int64_t grown = memory_stats().live_bytes - before;
    EXPECT_EQ(stage->num_parameters(), c.params) << "layers [" << c.range.start << ", " << c.range.end << ")";
    EXPECT_EQ(grown, 4 * c.params) << "layers [" << c.range.start << ", " << c.range.end << ")";
  }
}

TEST(ModelChunks, LayerParameterCountsMatchTheBuiltLayers) {
  std::vector<int64_t> counts = gpt_layer_param_counts(kCfg);
  ASSERT_EQ(int64_t(counts.size()), kCfg.num_layers());
  for (int64_t i = 0; i < kCfg.num_layers(); ++i)
    EXPECT_EQ(counts[size_t(i)], ModelChunks(kCfg, {i, i + 1}).num_parameters()) << "layer " << i;
}

TEST(ModelChunks, TwoChainedStagesReproduceTheFullModel) {
  Generator g(5);
  Tensor x = randint(0, kCfg.vocab_size, {3, 16}, g), y = randint(0, kCfg.vocab_size, {3, 16}, g);

  nn::GPT gpt(kCfg);
  Tensor full_logits = gpt.forward(x);
  Tensor full_loss = nn::cross_entropy_loss(full_logits, y);
  autograd::backward(full_loss);

  ModelChunks a(kCfg, {0, 3}), b(kCfg, {3, 6});
  Tensor act = a.forward(x);                          // [3, 16, 32], stays on "rank 0"
  Tensor received = ops::clone(autograd::detach(act));  // what the next stage would receive: a fresh leaf
  Tensor logits = b.forward(received);
  Tensor loss = nn::cross_entropy_loss(logits, y);
  EXPECT_TRUE(autograd::requires_grad(received));
  EXPECT_LT(relative_error(logits, full_logits), 1e-6);
  EXPECT_NEAR(loss.item<double>(), full_loss.item<double>(), 1e-6);

  Tensor input_grad = b.backward(received, loss, Tensor());  // last stage: from the loss
  ASSERT_TRUE(input_grad.defined());
  EXPECT_EQ(input_grad.shape(), act.shape());
  EXPECT_FALSE(a.backward(x, act, input_grad).defined());  // first stage: token ids have no gradient

  std::map<std::string, Tensor> full;
  for (auto& [n, p] : gpt.named_parameters()) full[n] = autograd::grad(p);
  for (ModelChunks* s : {&a, &b})
    for (auto& [n, p] : s->named_parameters())
      if (n != "wte.weight") {
        EXPECT_LT(relative_error(autograd::grad(p), full.at(n)), 1e-6) << n;
      }
  // The tied weight's gradient is split between the two copies; their sum is the model's.
  Tensor wte_sum = ops::add(autograd::grad(a.embedding_weight()), autograd::grad(b.embedding_weight()));
  EXPECT_LT(relative_error(wte_sum, full.at("wte.weight")), 1e-6);
}
