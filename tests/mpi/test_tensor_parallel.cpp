// Tensor parallelism's pieces against their unsplit versions (CTest runs it on
// 1, 2 and 4 ranks, tp = world): every rank builds the full layer from the same
// seed as the reference, the tp layer from its shard of the same weights, runs
// forward and backward on the same input and upstream gradient, and compares
// the output, the input's gradient and its weight shards' gradients with the
// matching slices of the reference (fp32, 1e-5 of the reference's scale).
// Shapes are odd where the split allows: in = 6, out = 5, N = 7 rows.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "tests/error_of.h"
#include "nn/loss.h"
#include "parallel/comm/distributed.h"
#include "parallel/model_chunks.h"
#include "parallel/tensor_parallel/sharding.h"
#include "parallel/tensor_parallel/block.h"
#include "parallel/tensor_parallel/cross_entropy.h"
#include "parallel/tensor_parallel/gpt.h"
#include "parallel/tensor_parallel/layers.h"
#include "parallel/tensor_parallel/mappings.h"
#include "parallel/tensor_parallel/replicas.h"
#include "parallel/tensor_parallel/shard_map.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

using namespace loom;
using namespace loom::parallel;
namespace ag = loom::autograd;

namespace {

// max |a - b| <= 1e-5 * max |b| (and equal shapes).
void expect_close(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) diff = std::max(diff, std::abs(x[i] - y[i])), scale = std::max(scale, std::abs(y[i]));
  EXPECT_LE(diff, 1e-5 * std::max(scale, 1e-6)) << what << ": max |diff| " << diff << " of scale " << scale;
}

Tensor leaf(const Tensor& t) {
  Tensor c = ops::clone(t);
  ag::set_requires_grad(c, true);
  return c;
}

// sum(y * r): a loss whose upstream gradient is r, different for every element.
void backward_with(const Tensor& y, const Tensor& r) { ag::backward(ag::sum(ag::mul(y, r))); }

ProcessGroup& tp() { return parallel::world(); }

}  // namespace

TEST(TensorParallel, ColumnParallelLinearGatheredEqualsTheFullLinear) {
  Generator gen(11);
  const int64_t out = 4 * 3;  // divides tp = 1, 2, 4
  Tensor W = randn({out, 6}, gen), b = randn({out}, gen), x = randn({2, 4, 6}, gen), r = randn({2, 4, out}, gen);
  Tensor xf = leaf(x), wf = leaf(W), bf = leaf(b);
  Tensor yf = ag::linear(xf, wf, bf);
  backward_with(yf, r);

  ColumnParallelLinear col(W, b, tp(), /*gather_output=*/true);
  Tensor xp = leaf(x);
  Tensor yp = col.forward(xp);
  backward_with(yp, r);
  expect_close(yp, yf, "output");
  expect_close(ag::grad(xp), ag::grad(xf), "input grad (f's all-reduce)");
  expect_close(ag::grad(col.weight), shard_of(ag::grad(wf), 0, tp(), "w"), "weight shard grad");
  expect_close(ag::grad(col.bias), shard_of(ag::grad(bf), 0, tp(), "b"), "bias shard grad");
}

TEST(TensorParallel, RowParallelLinearEqualsTheFullLinear) {
  Generator gen(12);
  const int64_t in = 8;
  Tensor W = randn({5, in}, gen), b = randn({5}, gen), x = randn({2, 4, in}, gen), r = randn({2, 4, 5}, gen);
  Tensor xf = leaf(x), wf = leaf(W), bf = leaf(b);
  backward_with(ag::linear(xf, wf, bf), r);
  Tensor yf = ops::linear(x, W, b);

  RowParallelLinear row(W, b, tp());
  Tensor xp = leaf(slice_along(x, -1, tp()));  // the input arrives split (a column layer's output)
  Tensor yp = row.forward(xp);
  backward_with(yp, r);
  expect_close(yp, yf, "output (g's all-reduce, bias once)");
  expect_close(ag::grad(xp), slice_along(ag::grad(xf), -1, tp()), "input slice grad");
  expect_close(ag::grad(row.weight), shard_of(ag::grad(wf), 1, tp(), "w"), "weight shard grad");
  expect_close(ag::grad(row.bias), ag::grad(bf), "replicated bias grad");
}

// The MLP as Megatron splits it: fc1 column-parallel, GELU on the shard, fc2
// row-parallel; with and without sequence parallelism (input and output
// sharded along T, all-gather before fc1, reduce-scatter after fc2).
class TensorParallelMlp : public ::testing::TestWithParam<bool> {};

TEST_P(TensorParallelMlp, EqualsTheFullMlp) {
  const bool sp = GetParam();
  Generator gen(13);
  const int64_t C = 6, H = 16, T = 4;
  Tensor W1 = randn({H, C}, gen), b1 = randn({H}, gen), W2 = randn({C, H}, gen), b2 = randn({C}, gen);
  Tensor x = randn({2, T, C}, gen), r = randn({2, T, C}, gen);
  Tensor xf = leaf(x), w1 = leaf(W1), w2 = leaf(W2);
  Tensor yf = ag::linear(ag::gelu(ag::linear(xf, w1, b1)), w2, b2);
  backward_with(yf, r);

  for (bool fused : {false, true}) {  // GELU on fc1's shard, or fused into it (forward_gelu, the TP MLP's)
    SCOPED_TRACE(fused ? "forward_gelu" : "gelu(forward)");
    ColumnParallelLinear fc1(W1, b1, tp(), false, sp);
    RowParallelLinear fc2(W2, b2, tp(), sp);
    Tensor xp = leaf(sp ? slice_along(x, 1, tp()) : x);
    Tensor yp = fc2.forward(fused ? fc1.forward_gelu(xp) : ag::gelu(fc1.forward(xp)));
    backward_with(yp, sp ? slice_along(r, 1, tp()) : r);
    expect_close(yp, sp ? slice_along(yf, 1, tp()) : yf, "output");
    expect_close(ag::grad(xp), sp ? slice_along(ag::grad(xf), 1, tp()) : ag::grad(xf), "input grad");
    expect_close(ag::grad(fc1.weight), shard_of(ag::grad(w1), 0, tp(), "w1"), "fc1 weight shard grad");
    expect_close(ag::grad(fc2.weight), shard_of(ag::grad(w2), 1, tp(), "w2"), "fc2 weight shard grad");
  }
}
INSTANTIATE_TEST_SUITE_P(SequenceParallel, TensorParallelMlp, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "sequence_parallel" : "tensor_parallel"; });

TEST(TensorParallel, VocabParallelEmbeddingEqualsTheFullEmbedding) {
  Generator gen(14);
  const int64_t V = 12, C = 3;
  Tensor W = randn({V, C}, gen), ids = randint(0, V, {2, 5}, gen, kInt64), r = randn({2, 5, C}, gen);
  Tensor wf = leaf(W);
  Tensor yf = ag::embedding(wf, ids);
  backward_with(yf, r);

  VocabParallelEmbedding emb(W, tp());
  Tensor yp = emb.forward(ids);
  backward_with(yp, r);
  expect_close(yp, yf, "lookup (g sums the owner's rows)");
  expect_close(ag::grad(emb.weight), shard_of(ag::grad(wf), 0, tp(), "w"), "table shard grad");
}

TEST(TensorParallel, VocabParallelCrossEntropyEqualsTheFullOneWithoutFullRows) {
  Generator gen(15);
  const int64_t N = 7, V = 12;
  Tensor logits = randn({N, V}, gen, kFloat32, 0.0, 3.0);
  Tensor targets = from_vector<int64_t>({3, 11, -100, 0, 7, -100, 5});  // two rows ignored
  Tensor lf = leaf(logits);
  Tensor loss_f = ag::cross_entropy(lf, targets);
  ag::backward(loss_f);

  const int64_t v = V / tp().size();
  Tensor lp = leaf(slice_along(logits, -1, tp()));  // this rank's V/tp columns only
  Tensor loss_p = vocab_parallel_cross_entropy(lp, targets, tp().rank() * v, tp());
  ag::backward(loss_p);
  expect_close(loss_p, loss_f, "loss");
  expect_close(ag::grad(lp), slice_along(ag::grad(lf), -1, tp()), "logit shard grad");
}

TEST(TensorParallel, AShapeThatDoesNotSplitIsNamed) {
  if (tp().size() == 1) GTEST_SKIP() << "every shape splits over one rank";
  Generator gen(16);
  Tensor W = randn({tp().size() * 2 + 1, 6}, gen);
  try {
    ColumnParallelLinear col(W, Tensor(), tp());
    ADD_FAILURE() << "an uneven split was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ColumnParallelLinear weight: dim 0 of [" + std::to_string(tp().size() * 2 + 1) +
                                         ", 6]"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("does not split over tp = " + std::to_string(tp().size())), std::string::npos)
        << e.what();
  }
}

// A whole transformer block: nn::Block against TensorParallelBlock cut from it
// (4 heads of 2: tp 4 gives each rank one head), with and without sequence
// parallelism. The replicated layernorm weights see all tokens without SP; with
// SP each rank sees T/tp of them, and their gradients summed over tp are the full ones.
class TensorParallelBlockTest : public ::testing::TestWithParam<bool> {};

TEST_P(TensorParallelBlockTest, EqualsTheFullBlock) {
  const bool sp = GetParam();
  Generator gen(17);
  const int64_t C = 8, H = 4, T = 4;
  nn::Block full(C, H, gen, 0.02);
  {
    NoGradGuard no_grad;  // larger weights than GPT-2's init, so every path carries a visible gradient
    for (auto& [name, p] : full.named_parameters()) ops::copy_(p, randn(p.shape(), gen, kFloat32, 0.0, 0.3));
  }
  Tensor x = randn({2, T, C}, gen), r = randn({2, T, C}, gen);
  Tensor xf = leaf(x);
  Tensor yf = full.forward(xf);
  backward_with(yf, r);

  TensorParallelBlock block(full, tp(), sp);
  Tensor xp = leaf(sp ? slice_along(x, 1, tp()) : x);
  Tensor yp = block.forward(xp);
  backward_with(yp, sp ? slice_along(r, 1, tp()) : r);
  expect_close(yp, sp ? slice_along(yf, 1, tp()) : yf, "output");
  expect_close(ag::grad(xp), sp ? slice_along(ag::grad(xf), 1, tp()) : ag::grad(xf), "input grad");

  nn::NamedTensors want = full.named_parameters();
  auto full_grad = [&](const std::string& name) {
    for (auto& [n, p] : want)
      if (n == name) return ag::grad(p);
    ADD_FAILURE() << "no " << name;
    return Tensor();
  };
  for (auto& [name, p] : block.named_parameters()) {
    Tensor g = ag::grad(p), ref = full_grad(name);
    if (name == "attn.c_attn.weight") ref = shard_of(qkv_rows_by_rank(ref, tp().size()), 0, tp(), "qkv");
    else if (name == "attn.c_attn.bias") ref = ops::view(shard_of(qkv_rows_by_rank(ops::unsqueeze(ref, 1), tp().size()), 0, tp(), "qkv"), {-1});
    else if (name == "mlp.c_fc.weight" || name == "mlp.c_fc.bias") ref = shard_of(ref, 0, tp(), "fc");
    else if (name == "attn.c_proj.weight" || name == "mlp.c_proj.weight") ref = shard_of(ref, 1, tp(), "proj");
    else if (sp) {  // replicated, and each rank saw T/tp tokens: the partial sums add up
      g = ops::clone(g);
      tp().all_reduce(g, ReduceOp::Sum);
    }
    expect_close(g, ref, name);
  }
  EXPECT_EQ(block.named_parameters().size(), want.size()) << "the same names as the full block";
  EXPECT_EQ(block.replicated_params().size(), 6u);
}
INSTANTIATE_TEST_SUITE_P(SequenceParallel, TensorParallelBlockTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "sequence_parallel" : "tensor_parallel"; });

// The whole GPT: nn::GPT with cross_entropy_loss against the tp layer list with
// the vocab-parallel loss, V = 10 (padded to 12 at tp 4), 4 heads, 2 blocks.
// Loss, and every parameter's gradient against the matching shard of the full
// one (wte: the embedding's and the head's parts, tied on this one stage).
class TensorParallelGptTest : public ::testing::TestWithParam<bool> {};

TEST_P(TensorParallelGptTest, LossAndGradientsEqualTheFullGpt) {
  const bool sp = GetParam();
  nn::GPTConfig cfg{10, 8, 2, 4, 8, 0.0, 21};
  nn::GPT full(cfg);
  Generator gen(18);
  Tensor idx = randint(0, 10, {2, 8}, gen, kInt64), y = randint(0, 10, {2, 8}, gen, kInt64);
  Tensor loss_f = nn::cross_entropy_loss(full.forward(idx), y);
  ag::backward(loss_f);

  auto layers = build_tensor_parallel_gpt_layers(cfg, 0, cfg.num_layers(), tp(), sp);
  Tensor x = idx;
  for (auto& layer : layers) x = layer->forward(x);
  auto& head = static_cast<TensorParallelHead&>(*layers.back());
  Tensor loss_p = head.loss(x, y);
  ag::backward(loss_p);
  expect_close(loss_p, loss_f, "loss");

  std::map<std::string, Tensor> want;
  for (auto& [name, p] : full.named_parameters()) want[name] = ag::grad(p);
  int checked = 0;
  for (size_t i = 0; i < layers.size(); ++i)
    for (auto& [name, p] : layers[i]->named_parameters()) {
      const std::string full_name = nn::gpt_layer_prefix(cfg, int64_t(i)) + name;
      Tensor g = ag::grad(p), ref = want.at(full_name);
      if (full_name == "wte.weight") {
        if (i != 0) continue;  // the head's wte is the same tensor
        const int64_t start = head.wte->vocab_start, rows = std::max<int64_t>(0, std::min<int64_t>(g.size(0), 10 - start));
        for (float e : ops::narrow(g, 0, rows, g.size(0) - rows).to_vector<float>()) EXPECT_EQ(e, 0.0f) << "padding rows";
        g = ops::narrow(g, 0, 0, rows), ref = ops::narrow(ref, 0, start, rows);
      } else if (full_name.find("c_attn.weight") != std::string::npos) {
        ref = shard_of(qkv_rows_by_rank(ref, tp().size()), 0, tp(), "qkv");
      } else if (full_name.find("c_attn.bias") != std::string::npos) {
        ref = ops::view(shard_of(qkv_rows_by_rank(ops::unsqueeze(ref, 1), tp().size()), 0, tp(), "qkv"), {-1});
      } else if (full_name.find("c_fc.") != std::string::npos) {
        ref = shard_of(ref, 0, tp(), "fc");
      } else if (full_name.find("c_proj.weight") != std::string::npos) {
        ref = shard_of(ref, 1, tp(), "proj");
      } else if (sp && (full_name.find("ln_") != std::string::npos || full_name.find("c_proj.bias") != std::string::npos)) {
        g = ops::clone(g);
        tp().all_reduce(g, ReduceOp::Sum);  // replicated, and each rank saw T/tp of the tokens
      }
      expect_close(g, ref, full_name);
      ++checked;
    }
  EXPECT_EQ(checked, int(want.size()));
}
INSTANTIATE_TEST_SUITE_P(SequenceParallel, TensorParallelGptTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "sequence_parallel" : "tensor_parallel"; });

// The shard maps (shard_map.h) against the full GPT: every shard joined by
// gather_full is the full model's tensor, bit for bit, and cut_shard of the
// full tensor is the shard - for every parameter, including c_attn's regrouped
// rows and the padded vocabulary (V = 10 over tp = 4: 12 rows, 2 of padding).
TEST(TensorParallel, ShardMapsJoinEveryShardIntoTheFullModelAndCutItBack) {
  nn::GPTConfig cfg{10, 8, 2, 4, 8, 0.0, 21};
  nn::GPT full(cfg);
  std::map<std::string, Tensor> want;
  for (auto& [name, p] : full.named_parameters()) want[name] = p;
  TensorParallelSharding sharding(cfg, tp(), false);
  ModelChunks stage(cfg, LayerRange{0, cfg.num_layers()}, sharding.layer_builder());
  nn::NamedTensors joined = sharding.full_state_dict(stage);
  ASSERT_EQ(joined.size(), want.size());
  const std::set<std::string> replicated = {"wpe.weight", "ln_f.weight", "ln_f.bias"};
  for (auto& [name, t] : joined) {
    EXPECT_EQ(t.shape(), want.at(name).shape()) << name;
    EXPECT_EQ(t.to_vector<float>(), want.at(name).to_vector<float>()) << name << ": joined shards";
  }
  int params = 0;
  for (auto& [name, p] : stage.named_parameters()) {
    if (tp().size() == 1) break;  // no maps without a split
    const ShardMap& map = sharding.shard_maps().at(name);
    EXPECT_EQ(ops::reshape(cut_shard(want.at(name), map), p.shape()).to_vector<float>(), p.to_vector<float>()) << name;
    const bool expect_replicated = replicated.count(name) || name.find("ln_") != std::string::npos ||
                                   name.find("c_proj.bias") != std::string::npos;
    EXPECT_EQ(map.replicated, expect_replicated) << name;
    ++params;
  }
  if (tp().size() > 1) {
    EXPECT_EQ(params, int(want.size()));
  }
}

// A replicated param whose copies differ by one bit on one rank is named on every rank.
TEST(TensorParallel, ReplicatedParamsThatDriftApartAreNamed) {
  if (tp().size() == 1) GTEST_SKIP() << "needs 2 or more tp ranks (runs at np 2 and 4)";
  nn::GPTConfig cfg{10, 8, 2, 4, 8, 0.0, 21};
  TensorParallelSharding sharding(cfg, tp(), false);
  ModelChunks stage(cfg, LayerRange{0, cfg.num_layers()}, sharding.layer_builder());
  check_tp_replicas_identical(sharding.replicated_params(stage), tp());  // as built: identical
  for (auto& [name, p] : sharding.replicated_params(stage))
    if (name == "blocks.1.ln_2.bias" && tp().rank() == 1) {
      NoGradGuard no_grad;
      float* v = p.data<float>();
      v[0] = std::nextafter(v[0], 1.0f);
    }
  const std::string msg =
      test::error_of([&] { check_tp_replicas_identical(sharding.replicated_params(stage), tp()); });
  EXPECT_NE(msg.find("blocks.1.ln_2.bias"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("blocks.0.ln_1.weight"), std::string::npos) << "only the drifted param is named: " << msg;
}
