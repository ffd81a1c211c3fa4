// The zero-bubble split of a backward (autograd/engine.h): B computes the
// input gradients and leaves each weight's for W; W computes what was left
// and fires the accumulator hooks then. The gradients are the ordinary
// backward's, bit for bit - on one op, through a checkpointed region, and on
// the GPT (gpt2 and llama, fp32 and bf16) over two micro-batches whose B and W
// interleave as a zero-bubble schedule runs them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "autograd/accumulate_grad.h"
#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/variable.h"
#include "parallel/model_chunks.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

using namespace loom;
using namespace loom::autograd;

namespace {

// Same dtype, shape and bytes.
bool same_bits(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  Tensor ca = ops::contiguous(a), cb = ops::contiguous(b);
  return std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

Tensor leaf(const Shape& shape, uint64_t seed) {
  Generator g(seed);
  Tensor t = randn(shape, g);
  set_requires_grad(t);
  return t;
}

}  // namespace

TEST(BackwardSplit, LinearLeavesItsWeightGradientForWAndItsHooksFireThen) {
  Tensor x = leaf({4, 3}, 1), w = leaf({5, 3}, 2), b = leaf({5}, 3);
  Generator g(4);
  Tensor dy = randn({4, 5}, g);

  backward({linear(x, w, b)}, {dy});  // the ordinary backward: what B + W must give
  Tensor dx = grad(x), dw = grad(w), db = grad(b);
  zero_grad({x, w, b});

  std::vector<std::string> log;
  RemovableHandle on_w = grad_accumulator(w)->register_hook([&](Tensor&) {
    log.push_back("w");
    Engine::queue_callback([&] { log.push_back("callback"); });  // as DataParallelBucket does
  });
  RemovableHandle on_b = register_post_accumulate_grad_hook(b, [&](Tensor&) { log.push_back("b"); });

  WeightGrads later = Engine::backward_input({linear(x, w, b)}, {dy}, {x});
  EXPECT_TRUE(same_bits(grad(x), dx));                        // B: the input's gradient, now
  EXPECT_FALSE(grad(w).defined() || grad(b).defined());       // the weights' wait
  EXPECT_TRUE(log.empty());                                   // and so do their hooks
  EXPECT_EQ(later.ops(/*deferred=*/true), std::vector<std::string>{"LinearBackward"});

  Engine::run_weight_grads(later);
  EXPECT_TRUE(same_bits(grad(w), dw));
  EXPECT_TRUE(same_bits(grad(b), db));
  EXPECT_EQ(log, (std::vector<std::string>{"w", "b", "callback"}));
  EXPECT_TRUE(later.empty());
}

// A weight whose gradient a non-separable op computes (layer norm's γ, β: one
// fused kernel gives dx, dγ and dβ) gets it in B, but accumulates it in W.
TEST(BackwardSplit, ANonSeparableOpComputesItsWeightGradientInBAndAccumulatesItInW) {
  Tensor x = leaf({4, 6}, 5), gamma = leaf({6}, 6), beta = leaf({6}, 7);
  int fired = 0;
  RemovableHandle h = grad_accumulator(gamma)->register_hook([&](Tensor&) { ++fired; });
  WeightGrads later = Engine::backward_input({sum(layer_norm(x, gamma, beta))}, {}, {x});
  EXPECT_TRUE(grad(x).defined());
  EXPECT_FALSE(grad(gamma).defined());
  EXPECT_EQ(fired, 0);
  EXPECT_EQ(later.ops(/*deferred=*/false), std::vector<std::string>{"LayerNormBackward"});
  EXPECT_TRUE(later.ops(/*deferred=*/true).empty());
  Engine::run_weight_grads(later);
  EXPECT_TRUE(grad(gamma).defined() && grad(beta).defined());
  EXPECT_EQ(fired, 1);
}

// Activation recomputation reruns a region inside B; its weights wait for W too,
// while the region's input gradient (the stand-in leaves') is B's.
TEST(BackwardSplit, ACheckpointedRegionLeavesItsWeightsForWAndReturnsItsInputGradient) {
  Tensor x = leaf({4, 3}, 8), w1 = leaf({6, 3}, 9), w2 = leaf({2, 6}, 10);
  auto region = [&](const TensorList& in) { return TensorList{linear(gelu(linear(in[0], w1, Tensor())), w2, Tensor())}; };
  backward(sum(checkpoint(region, {x})[0]));
  Tensor dx = grad(x), dw1 = grad(w1), dw2 = grad(w2);
  zero_grad({x, w1, w2});

  WeightGrads later = Engine::backward_input({sum(checkpoint(region, {x})[0])}, {}, {x});
  EXPECT_TRUE(same_bits(grad(x), dx));
  EXPECT_FALSE(grad(w1).defined() || grad(w2).defined());
  Engine::run_weight_grads(later);
  EXPECT_TRUE(same_bits(grad(w1), dw1));
  EXPECT_TRUE(same_bits(grad(w2), dw2));
}

// The GPT, as a pipeline stage holding layers [1, L + 2) (blocks and head: its
// input is an activation, so B's input gradient is checked too) and as the
// whole model (the tied wte: one gradient from the embedding, one from the
// head). Two micro-batches run F0 B0 F1 B1 W0 W1, as ZB-H1 may order them;
// every gradient equals F0 B0 F1 B1 of the ordinary backward, bit for bit, and
// the accumulator hooks fire as often and in the same order (what bucketed
// data parallelism's readiness relies on).
struct SplitCase {
  const char* arch;
  DType dtype;
};

class BackwardSplitGPT : public ::testing::TestWithParam<SplitCase> {};

TEST_P(BackwardSplitGPT, GradientsAreTheOrdinaryBackwardsBitForBit) {
  nn::GPTConfig cfg{32, 8, 2, 2, 16, 0.0, 11};
  cfg.set_arch(GetParam().arch);
  const DType dt = GetParam().dtype;
  Generator g(12);
  std::vector<Tensor> ids, targets, acts;
  for (int mb = 0; mb < 2; ++mb) {
    ids.push_back(randint(0, cfg.vocab_size, {2, 8}, g));
    targets.push_back(randint(0, cfg.vocab_size, {2, 8}, g));
    acts.push_back(ops::to(randn({2, 8, cfg.n_embd}, g), dt));
  }

  for (parallel::LayerRange layers : {parallel::LayerRange{1, cfg.num_layers()}, parallel::LayerRange{0, cfg.num_layers()}}) {
    SCOPED_TRACE(std::string(GetParam().arch) + " " + dtype_name(dt) + ", layers [" + std::to_string(layers.start) + ", " +
                 std::to_string(layers.end) + ")");
    // One stage's two micro-batches; `split` runs B and W apart. Returns the
    // input gradients; `fired` gets the params' names as their accumulator hooks fire.
    auto run = [&](parallel::ModelChunks& stage, bool split, std::vector<std::string>& fired) {
      std::vector<RemovableHandle> hooks;
      for (auto& named : stage.named_parameters())  // not a structured binding: clang 14 cannot capture one
        hooks.push_back(grad_accumulator(named.second)->register_hook(
            [&fired, name = named.first](Tensor&) { fired.push_back(name); }));
      std::vector<Tensor> input_grads;
      std::vector<WeightGrads> later(2);
      for (int mb = 0; mb < 2; ++mb) {
        Tensor in = layers.start == 0 ? ids[size_t(mb)] : detach(acts[size_t(mb)]);
        Tensor loss = stage.loss(stage.forward(in), targets[size_t(mb)]) * 0.5;
        input_grads.push_back(stage.backward(in, loss, Tensor(), 0, split ? &later[size_t(mb)] : nullptr));
      }
      for (WeightGrads& w : later) Engine::run_weight_grads(w);
      return input_grads;
    };
    parallel::ModelChunks plain(cfg, layers), zb(cfg, layers);
    plain.to(dt), zb.to(dt);
    std::vector<std::string> fired_plain, fired_zb;
    std::vector<Tensor> dx_plain = run(plain, false, fired_plain), dx_zb = run(zb, true, fired_zb);
    EXPECT_EQ(fired_plain, fired_zb);  // each param's hook once per micro-batch, in backward()'s order
    for (int mb = 0; mb < 2 && layers.start > 0; ++mb)
      EXPECT_TRUE(same_bits(dx_plain[size_t(mb)], dx_zb[size_t(mb)])) << "input, mb " << mb;
    auto p = plain.named_parameters(), z = zb.named_parameters();
    ASSERT_EQ(p.size(), z.size());
    for (size_t i = 0; i < p.size(); ++i) EXPECT_TRUE(same_bits(grad(p[i].second), grad(z[i].second))) << p[i].first;
  }
}

INSTANTIATE_TEST_SUITE_P(ArchAndDtype, BackwardSplitGPT,
                         ::testing::Values(SplitCase{"gpt2", kFloat32}, SplitCase{"gpt2", kBFloat16},
                                           SplitCase{"llama", kFloat32}, SplitCase{"llama", kBFloat16}),
                         [](const auto& info) {
                           return std::string(info.param.arch) + "_" + dtype_name(info.param.dtype);
                         });

// Which ops of the GPT leave their weight gradient's computation for W, and
// which compute it in B (and leave only the accumulation): the list this
// split has, for each architecture.
TEST(BackwardSplit, TheGPTsSeparableAndNonSeparableOps) {
  for (const char* arch : {"gpt2", "llama"}) {
    nn::GPTConfig cfg{32, 8, 2, 2, 16, 0.0, 11};
    cfg.set_arch(arch);
    parallel::ModelChunks model(cfg, parallel::LayerRange{0, cfg.num_layers()});
    Generator g(13);
    Tensor ids = randint(0, 32, {2, 8}, g), y = randint(0, 32, {2, 8}, g);
    WeightGrads later;
    model.backward(ids, model.loss(model.forward(ids), y), Tensor(), 0, &later);
    std::vector<std::string> deferred = later.ops(true), in_b = later.ops(false);
    std::sort(deferred.begin(), deferred.end());
    EXPECT_EQ(deferred, (std::vector<std::string>{"EmbeddingBackward", "LinearBackward"})) << arch;
    // One fused row kernel computes a norm's dx and its weight's gradient together.
    EXPECT_EQ(in_b, std::vector<std::string>{std::string(arch) == "gpt2" ? "LayerNormBackward" : "RMSNormBackward"})
        << arch;
    Engine::run_weight_grads(later);
  }
}
