// nn/: Module's parameter registry and state_dict, the layers, and the GPT as
// a whole model and as a list of layers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "error_of.h"
#include "autograd/engine.h"
#include "autograd/functions.h"
#include "nn/generate.h"
#include "nn/gpt.h"
#include "nn/loss.h"
#include "tensor/grad_mode.h"

using namespace loom;
using namespace loom::nn;

namespace {

GPTConfig small_config(int64_t n_layer = 2, uint64_t seed = 0) {
  GPTConfig cfg;
  cfg.vocab_size = 65;
  cfg.block_size = 16;
  cfg.n_layer = n_layer;
  cfg.n_head = 2;
  cfg.n_embd = 32;
  cfg.seed = seed;
  return cfg;
}

Tensor token_batch(const GPTConfig& cfg, int64_t B, int64_t T, uint64_t seed = 7) {
  Generator gen(seed);
  return randint(0, cfg.vocab_size, {B, T}, gen);
}

// Runs layers [0, n) of a list in order, the way a pipeline would.
Tensor run_layers(const std::vector<std::shared_ptr<Layer>>& layers, Tensor x) {
  for (const auto& layer : layers) x = layer->forward(x);
  return x;
}

void expect_bit_equal(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>()) << what;
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / double(v.size());
}

double std_of(const std::vector<double>& v) {
  double m = mean_of(v), s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size()));
}

using loom::test::error_of;

}  // namespace

// ---- Module --------------------------------------------------------------------------

TEST(Module, RegisterParameterMarksRequiresGradAndRejectsBadNames) {
  struct M : Module {};
  M m;
  Tensor w = m.register_parameter("w", zeros({2}));
  EXPECT_TRUE(autograd::requires_grad(w));
  EXPECT_NE(error_of([&] { m.register_parameter("w", zeros({1})); }).find("'w' is already registered"),
            std::string::npos);
  EXPECT_NE(error_of([&] { m.register_parameter("a.b", zeros({1})); }).find("invalid name 'a.b'"), std::string::npos);
  EXPECT_NE(error_of([&] { m.register_module("w", std::make_shared<M>()); }).find("'w' is already registered"),
            std::string::npos);
}

TEST(Module, OwnParametersComeBeforeChildrenDepthFirst) {
  struct Leaf : Module {
    Leaf() { register_parameter("p", zeros({1})); }
  };
  struct Root : Module {
    Root() {
      register_module("a", std::make_shared<Leaf>());
      register_parameter("own", zeros({1}));
      auto list = register_module("list", std::make_shared<ModuleList<Leaf>>());
      list->push_back(std::make_shared<Leaf>());
      list->push_back(std::make_shared<Leaf>());
    }
  };
  std::vector<std::string> names;
  for (auto& [n, t] : Root().named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"own", "a.p", "list.0.p", "list.1.p"}));
}

// Forward pre-hooks (PyTorch's register_forward_pre_hook): calling a layer runs
// them in registration order with the module and its input, before forward;
// the handle removes its hook; forward() called directly runs none.
TEST(Module, ForwardPreHooksRunBeforeForwardUntilTheirHandleGoes) {
  GPTConfig cfg = small_config(2);
  GPT model(cfg);
  Tensor idx = token_batch(cfg, 2, 8);
  std::vector<std::string> log;
  Layer& block0 = *model.layers()[1];
  auto first = block0.register_forward_pre_hook([&](Module& m, const Tensor& x) {
    EXPECT_EQ(&m, &block0);
    EXPECT_EQ(x.shape(), (Shape{2, 8, 32}));  // the embedding's output: [B, T, C]
    log.push_back("first");
  });
  {
    auto second = model.layers()[1]->register_forward_pre_hook([&](Module&, const Tensor&) { log.push_back("second"); });
    auto head = model.layers().back()->register_forward_pre_hook([&](Module&, const Tensor&) { log.push_back("head"); });
    Tensor logits = model.forward(idx);  // runs each layer as layer(x)
    EXPECT_EQ(log, (std::vector<std::string>{"first", "second", "head"}));
  }
  log.clear();
  model.forward(idx);
  EXPECT_EQ(log, (std::vector<std::string>{"first"})) << "the other handles went out of scope";
  first.remove();
  log.clear();
  model.forward(idx);
  block0.forward(model.layers()[0]->forward(idx));
  EXPECT_TRUE(log.empty());
}

// Forward hooks (PyTorch's register_forward_hook): run after forward with the
// input and the output, and what a hook leaves in the output is what the
// caller gets (ZeRO-3 wraps a unit's output there).
TEST(Module, ForwardHooksRunAfterForwardAndMayReplaceTheOutput) {
  GPTConfig cfg = small_config(2);
  GPT model(cfg);
  Tensor idx = token_batch(cfg, 2, 8);
  Layer& block0 = *model.layers()[1];
  Tensor x = model.layers()[0]->forward(idx);
  Tensor plain = block0.forward(x);
  std::vector<std::string> log;
  auto pre = block0.register_forward_pre_hook([&](Module&, const Tensor&) { log.push_back("pre"); });
  auto post = block0.register_forward_hook([&](Module& m, const Tensor& in, Tensor& out) {
    EXPECT_EQ(&m, &block0);
    EXPECT_TRUE(in.is_same(x));
    EXPECT_EQ(out.shape(), (Shape{2, 8, 32}));
    log.push_back("post");
    out = ops::mul(out, 2.0);
  });
  Tensor hooked = block0(x);
  EXPECT_EQ(log, (std::vector<std::string>{"pre", "post"}));
  EXPECT_EQ(hooked.to_vector<float>(), ops::mul(plain, 2.0).to_vector<float>());
  post.remove();
  EXPECT_EQ(block0(x).to_vector<float>(), plain.to_vector<float>()) << "the hook went with its handle";
}

// ---- GPT parameters --------------------------------------------------------------------

TEST(GPT, NamedParametersOfATwoLayerModelAreNanoGPTsInOrder) {
  GPT model(small_config());
  std::vector<std::pair<std::string, Shape>> expected = {{"wte.weight", {65, 32}}, {"wpe.weight", {16, 32}}};
  for (int i = 0; i < 2; ++i) {
    std::string b = "blocks." + std::to_string(i) + ".";
    std::vector<std::pair<std::string, Shape>> block = {
        {b + "ln_1.weight", {32}},         {b + "ln_1.bias", {32}},
        {b + "attn.c_attn.weight", {96, 32}}, {b + "attn.c_attn.bias", {96}},
        {b + "attn.c_proj.weight", {32, 32}}, {b + "attn.c_proj.bias", {32}},
        {b + "ln_2.weight", {32}},         {b + "ln_2.bias", {32}},
        {b + "mlp.c_fc.weight", {128, 32}},  {b + "mlp.c_fc.bias", {128}},
        {b + "mlp.c_proj.weight", {32, 128}}, {b + "mlp.c_proj.bias", {32}}};
    expected.insert(expected.end(), block.begin(), block.end());
  }
  expected.push_back({"ln_f.weight", {32}});
  expected.push_back({"ln_f.bias", {32}});

  NamedTensors params = model.named_parameters();
  ASSERT_EQ(params.size(), expected.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].first, expected[i].first) << "entry " << i;
    EXPECT_EQ(params[i].second.shape(), expected[i].second) << params[i].first;
    EXPECT_TRUE(autograd::requires_grad(params[i].second)) << params[i].first;
  }
  NamedTensors state = model.state_dict();
  ASSERT_EQ(state.size(), params.size());
  for (size_t i = 0; i < state.size(); ++i) EXPECT_EQ(state[i].first, params[i].first);
}

TEST(GPT, TiedEmbeddingIsListedOnceAndTheHeadUsesItsStorage) {
  GPT model(small_config());
  const Tensor& wte = model.embedding()->wte->weight;
  EXPECT_TRUE(model.head()->wte->weight.is_same(wte));
  EXPECT_EQ(model.head()->wte->weight.storage().get(), wte.storage().get());
  int count = 0;
  for (auto& [name, t] : model.named_parameters()) count += t.storage() == wte.storage();
  EXPECT_EQ(count, 1);

  // Writing into wte changes the head's projection: logits of a token whose
  // final hidden state is h are h . wte[v]; zeroing row 5 zeroes logit 5.
  {
    NoGradGuard g;
    ops::fill_(ops::narrow(wte, 0, 5, 1), 0.0);
  }
  Tensor logits = model.forward(token_batch(model.config(), 2, 8));
  for (float v : ops::narrow(logits, 2, 5, 1).to_vector<float>()) EXPECT_EQ(v, 0.0f);
}

TEST(GPT, ParameterCountIsVCPlusTCPlusL12C2Plus13CPlus2C) {
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {{2, 32, 2}, {4, 128, 4}, {3, 48, 6}};
  for (auto [L, C, H] : shapes) {
    GPTConfig cfg = small_config(L);
    cfg.n_embd = C;
    cfg.n_head = H;
    const int64_t V = cfg.vocab_size, T = cfg.block_size;
    EXPECT_EQ(GPT(cfg).num_parameters(), V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C) << "L=" << L << " C=" << C;
  }
}

// ---- state_dict --------------------------------------------------------------------------

TEST(GPT, StateDictRoundTripReproducesWeightsAndLogits) {
  GPT a(small_config(2, 1)), b(small_config(2, 2));
  Tensor idx = token_batch(a.config(), 2, 8);
  EXPECT_NE(a.forward(idx).to_vector<float>(), b.forward(idx).to_vector<float>());  // different seeds

  Module::LoadResult r = b.load_state_dict(a.state_dict());
  EXPECT_TRUE(r.missing_keys.empty() && r.unexpected_keys.empty());
  NamedTensors pa = a.named_parameters(), pb = b.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) expect_bit_equal(pa[i].second, pb[i].second, pa[i].first);
  expect_bit_equal(a.forward(idx), b.forward(idx), "logits");
  // The tie survives a load: the head still reads b's (now loaded) wte.
  EXPECT_TRUE(b.head()->wte->weight.is_same(b.embedding()->wte->weight));
}

TEST(GPT, LoadStateDictNamesMissingUnexpectedAndMisshapedEntries) {
  GPT model(small_config());
  NamedTensors state = model.state_dict();
  const std::vector<float> wte_before = model.embedding()->wte->weight.to_vector<float>();

  NamedTensors bad;
  for (auto& [name, t] : state) {
    if (name == "blocks.1.ln_2.bias") continue;                          // missing
    if (name == "wte.weight") bad.emplace_back(name, zeros({64, 32}));   // mis-shaped
    else bad.emplace_back(name, zeros(t.shape()));
  }
  bad.emplace_back("lm_head.weight", zeros({65, 32}));                   // unexpected

  std::string msg = error_of([&] { model.load_state_dict(bad); });
  EXPECT_NE(msg.find("missing (1):\n    blocks.1.ln_2.bias"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unexpected (1):\n    lm_head.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mis-shaped (1):\n    wte.weight: checkpoint [64, 32] vs model [65, 32]"), std::string::npos)
      << msg;
  // Nothing was copied: the check runs before any write.
  EXPECT_EQ(model.embedding()->wte->weight.to_vector<float>(), wte_before);

  // Non-strict: still refuses a wrong shape, but skips missing/unexpected names and reports them.
  bad[0].second = zeros({65, 32});
  Module::LoadResult r = model.load_state_dict(bad, /*strict=*/false);
  EXPECT_EQ(r.missing_keys, std::vector<std::string>{"blocks.1.ln_2.bias"});
  EXPECT_EQ(r.unexpected_keys, std::vector<std::string>{"lm_head.weight"});
  for (float v : model.embedding()->wte->weight.to_vector<float>()) EXPECT_EQ(v, 0.0f);
}

// ---- train / eval ------------------------------------------------------------------------

TEST(GPT, TrainAndEvalReachEveryModuleAndSwitchDropout) {
  GPTConfig cfg = small_config();
  cfg.dropout = 0.5;
  GPT dropped(cfg);
  GPT plain(small_config());  // same seed, dropout 0: identical weights (dropout seeds are drawn after them)
  Tensor idx = token_batch(cfg, 2, 8);

  std::function<void(const Module&, bool)> all_in_mode = [&](const Module& m, bool on) {
    EXPECT_EQ(m.is_training(), on);
    for (auto& [n, c] : m.named_children()) all_in_mode(*c, on);
  };
  dropped.eval();
  all_in_mode(dropped, false);
  for (auto& layer : dropped.layers()) all_in_mode(*layer, false);
  expect_bit_equal(dropped.forward(idx), plain.forward(idx), "eval-mode logits");

  dropped.train();
  all_in_mode(dropped, true);
  for (auto& layer : dropped.layers()) all_in_mode(*layer, true);
  EXPECT_NE(dropped.forward(idx).to_vector<float>(), plain.forward(idx).to_vector<float>());
}

// ---- the layer list ----------------------------------------------------------------------

TEST(GPT, LayerListForwardIsBitIdenticalToTheModel) {
  GPTConfig cfg = small_config(3);
  GPT model(cfg);
  Tensor idx = token_batch(cfg, 3, 16);
  Tensor expected = model.forward(idx);

  // One list holding all layers (tied head), and two separately built stages (untied head copy).
  expect_bit_equal(run_layers(build_gpt_layers(cfg, 0, cfg.num_layers()), idx), expected, "one list");
  Tensor mid = run_layers(build_gpt_layers(cfg, 0, 2), idx);
  EXPECT_EQ(mid.shape(), (Shape{3, 16, 32}));
  expect_bit_equal(run_layers(build_gpt_layers(cfg, 2, cfg.num_layers()), mid), expected, "two stages");
}

TEST(GPT, AStageOfLayers2To4HasTheFullModelsWeights) {
  GPTConfig cfg = small_config(4);
  GPT model(cfg);
  std::map<std::string, Tensor> full;
  for (auto& [n, t] : model.named_parameters()) full[n] = t;

  auto stage = build_gpt_layers(cfg, 2, 4);  // blocks 1 and 2
  std::set<std::string> seen;
  for (int64_t i = 2; i < 4; ++i)
    for (auto& [n, t] : stage[size_t(i - 2)]->named_parameters()) {
      std::string name = gpt_layer_prefix(cfg, i) + n;
      ASSERT_TRUE(full.count(name)) << name;
      expect_bit_equal(t, full[name], name);
      seen.insert(name);
    }
  EXPECT_EQ(seen.size(), 24u);
  EXPECT_TRUE(seen.count("blocks.1.attn.c_attn.weight") && seen.count("blocks.2.mlp.c_proj.bias"));

  // A head built without the embedding owns a copy of wte equal to the full model's.
  auto head = build_gpt_layers(cfg, cfg.num_layers() - 1, cfg.num_layers());
  NamedTensors hp = head[0]->named_parameters();
  ASSERT_EQ(hp.size(), 3u);
  EXPECT_EQ(hp[2].first, "wte.weight");
  EXPECT_FALSE(hp[2].second.is_same(model.embedding()->wte->weight));
  expect_bit_equal(hp[2].second, full["wte.weight"], "head's wte copy");
}

TEST(GPT, InitialisationIsGPT2s) {
  GPTConfig cfg = small_config(8);
  cfg.n_embd = 256;
  cfg.n_head = 4;
  auto block = std::static_pointer_cast<Block>(build_gpt_layers(cfg, 3, 4)[0]);
  // c_fc.weight: 1024 x 256 draws; the sample std of N(0, s) is within ~0.2% of s at this size.
  std::vector<double> fc = block->mlp->c_fc->weight.to_vector<double>();
  EXPECT_NEAR(std_of(fc), 0.02, 0.02 * 0.01);
  EXPECT_NEAR(mean_of(fc), 0.0, 0.02 * 0.01);
  const double proj = 0.02 / std::sqrt(2.0 * 8);
  EXPECT_NEAR(std_of(block->mlp->c_proj->weight.to_vector<double>()), proj, proj * 0.01);
  EXPECT_NEAR(std_of(block->attn->c_proj->weight.to_vector<double>()), proj, proj * 0.02);  // 65k draws
  for (double v : block->mlp->c_fc->bias.to_vector<double>()) EXPECT_EQ(v, 0.0);
  for (double v : block->ln_1->weight.to_vector<double>()) EXPECT_EQ(v, 1.0);
  for (double v : block->ln_1->bias.to_vector<double>()) EXPECT_EQ(v, 0.0);
}

// ---- layers, by hand -------------------------------------------------------------------

TEST(Layers, LinearComputesXWTransposedPlusBias) {
  Generator gen(0);
  Linear fc(2, 3, gen);
  {
    NoGradGuard g;
    ops::copy_(fc.weight, tensor({1, 2, 3, 4, 5, 6}, {3, 2}));
    ops::copy_(fc.bias, tensor({1, 0, -1}));
  }
  // [1, 1] @ [[1, 3, 5], [2, 4, 6]] + [1, 0, -1] = [4, 7, 10]
  EXPECT_EQ(fc.forward(tensor({1, 1}, {1, 1, 2})).to_vector<float>(), (std::vector<float>{4, 7, 10}));
}

TEST(Layers, DropoutZeroesAboutPAndScalesTheRestInTrainingOnly) {
  Dropout drop(0.25, 3);
  Tensor x = ones({10000});
  std::vector<float> y = drop.forward(x).to_vector<float>();
  int zeros_n = 0;
  for (float v : y) {
    if (v == 0.0f) ++zeros_n;
    else EXPECT_FLOAT_EQ(v, 1.0f / 0.75f);
  }
  EXPECT_NEAR(zeros_n / 10000.0, 0.25, 0.02);  // 5 sigma of a binomial(10000, 0.25)
  drop.eval();
  EXPECT_TRUE(drop.forward(x).is_same(x));
}

TEST(Layers, AttentionIsCausalAFutureTokenDoesNotChangeEarlierLogits) {
  GPTConfig cfg = small_config();
  GPT model(cfg);
  Tensor idx = token_batch(cfg, 1, 10);
  Tensor changed = ops::clone(idx);
  changed.data<int64_t>()[6] = (idx.data<int64_t>()[6] + 1) % cfg.vocab_size;
  Tensor a = model.forward(idx), b = model.forward(changed);
  expect_bit_equal(ops::narrow(a, 1, 0, 6), ops::narrow(b, 1, 0, 6), "positions 0..5");
  EXPECT_NE(ops::narrow(a, 1, 6, 1).to_vector<float>(), ops::narrow(b, 1, 6, 1).to_vector<float>());
}

TEST(Layers, EmbeddingRejectsSequencesLongerThanBlockSize) {
  GPT model(small_config());
  std::string msg = error_of([&] { model.forward(zeros({1, 17}, kInt64)); });
  EXPECT_NE(msg.find("sequence length 17 exceeds block_size 16"), std::string::npos) << msg;
}

TEST(Loss, CrossEntropyIsTheMeanOverCountedTokens) {
  // Row 0: logits [0, ln 3], target 1 -> p = 3/4.  Row 1: uniform over 2, target 0 -> p = 1/2.
  // Row 2: ignored. Mean over 2 counted rows.
  Tensor logits = tensor({0, std::log(3.0), 0, 0, 5, -5}, {1, 3, 2});
  Tensor targets = from_vector<int64_t>({1, 0, -100}, {1, 3});
  Tensor loss = cross_entropy_loss(logits, targets);
  EXPECT_NEAR(loss.item<double>(), (-std::log(0.75) - std::log(0.5)) / 2, 1e-6);
  EXPECT_NE(error_of([&] { cross_entropy_loss(logits, from_vector<int64_t>({1, 0}, {1, 2})); }).find("do not match"),
            std::string::npos);
}

TEST(GPT, BackwardReachesEveryParameter) {
  GPT model(small_config());
  Tensor idx = token_batch(model.config(), 2, 8);
  Tensor loss = cross_entropy_loss(model.forward(idx), token_batch(model.config(), 2, 8, 9));
  autograd::backward(loss);
  for (auto& [name, p] : model.named_parameters()) {
    Tensor g = autograd::grad(p);
    ASSERT_TRUE(g.defined()) << name;
    EXPECT_EQ(g.shape(), p.shape()) << name;
  }
}

// ---- generate --------------------------------------------------------------------------

// top_k 1 leaves one token to draw: each new token is the argmax of the logits
// at the last position, whatever the seed. The prompt is kept in front.
TEST(Generate, TopKOneIsGreedyArgmaxOverTheLastPosition) {
  GPT model(small_config());
  std::vector<int32_t> ids = {3, 1, 4};
  std::vector<int32_t> out = generate(model, ids, {/*num_tokens=*/5, /*temperature=*/0.7, /*top_k=*/1, /*seed=*/42});
  ASSERT_EQ(out.size(), 8u);
  EXPECT_EQ(std::vector<int32_t>(out.begin(), out.begin() + 3), ids);
  NoGradGuard no_grad;
  model.eval();
  for (size_t n = 3; n < out.size(); ++n) {
    std::vector<int64_t> ctx(out.begin(), out.begin() + long(n));
    Tensor logits = model.forward(from_vector(ctx, {1, int64_t(n)}));  // [1, n, V]
    std::vector<float> last =
        ops::narrow(ops::reshape(logits, {int64_t(n), 65}), 0, int64_t(n) - 1, 1).to_vector<float>();  // [V]
    EXPECT_EQ(out[n], int32_t(std::max_element(last.begin(), last.end()) - last.begin())) << "token " << n;
  }
}

// Sampling draws from a seeded generator: the same seed gives the same text, and
// the model is left in the mode it was in.
TEST(Generate, SameSeedSameSampleAndTheTrainingModeIsRestored) {
  GPT model(small_config());
  std::vector<int32_t> a = generate(model, {0}, {20, 1.0, 0, 7}), b = generate(model, {0}, {20, 1.0, 0, 7});
  EXPECT_EQ(a, b);
  EXPECT_NE(a, generate(model, {0}, {20, 1.0, 0, 8}));
  EXPECT_TRUE(model.is_training());
  EXPECT_NE(error_of([&] { generate(model, {0}, {1, 0.0, 0, 0}); }).find("temperature must be > 0"), std::string::npos);
}
