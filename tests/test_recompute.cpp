// Activation recomputation: autograd::checkpoint (autograd/checkpoint.h)
// against finite differences and against the same region run without it, its
// hooks and callbacks, and --recompute's models (parallel/recompute.h) against
// the model without recomputation, gradient for gradient, to the bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "autograd/accumulate_grad.h"
#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/variable.h"
#include "error_of.h"
#include "gradcheck.h"
#include "parallel/recompute.h"
#include "parallel/teach/teach_break.h"
#include "tensor/ops.h"

namespace loom::test {
namespace {

using namespace loom::autograd;

// A region with a parameter it closes over (w, not an input of the
// checkpoint: its gradient must come through its AccumulateGrad node in the
// rerun's backward) and, when gen is given, dropout:
//   y = dropout(tanh(x0 @ w)) * x1 + gelu(x1)     x0 [3, 4], w [4, 5], x1 [3, 5]
TensorList region(const TensorList& in, const Tensor& w, PhiloxGenerator* gen) {
  Tensor h = tanh(matmul(in[0], w));
  if (gen) h = dropout(h, 0.5, *gen);
  return {h * in[1] + gelu(in[1])};
}

TEST(Checkpoint, GradientsOfInputsAndParamsMatchFiniteDifferences) {
  Tensor x0 = leaf(randn64({3, 4}, 1)), x1 = leaf(randn64({3, 5}, 2)), w = leaf(randn64({4, 5}, 3));
  auto f = [](const TensorList& x) {
    const Tensor w = x[2];
    return checkpoint([w](const TensorList& in) { return region(in, w, nullptr); }, {x[0], x[1]})[0];
  };
  EXPECT_TRUE(gradcheck(f, {x0, x1, w}));
}

// Every evaluation starts the generator at offset 0, so the function checked is
// one fixed mask's. The gradient is right only if the rerun in backward draws
// that mask again: a fresh one (offset 1) differentiates another function.
TEST(Checkpoint, WithDropoutInsideGradientsMatchFiniteDifferences) {
  Tensor x0 = leaf(randn64({3, 4}, 4)), x1 = leaf(randn64({3, 5}, 5)), w = leaf(randn64({4, 5}, 6));
  PhiloxGenerator gen{/*seed=*/77, 0};
  auto f = [&gen](const TensorList& x) {
    gen.offset = 0;
    const Tensor w = x[2];
    PhiloxGenerator* g = &gen;
    return checkpoint([w, g](const TensorList& in) { return region(in, w, g); }, {x[0], x[1]}, {&gen})[0];
  };
  EXPECT_TRUE(gradcheck(f, {x0, x1, w}));
}

// The same region with and without the checkpoint, float32 with dropout: the
// same output, the same gradients to the bit, and the generator where one run
// leaves it (the rerun's draw is not counted: the next step's masks are the
// ones it would have drawn).
TEST(Checkpoint, GradientsAreBitIdenticalToTheRegionWithoutIt) {
  auto run = [](bool checkpointed) {
    Generator init(9);
    Tensor x0 = leaf(randn({6, 8}, init)), x1 = leaf(randn({6, 10}, init)), w = leaf(randn({8, 10}, init));
    PhiloxGenerator gen{5, 3};
    PhiloxGenerator* g = &gen;
    auto fn = [w, g](const TensorList& in) { return region(in, w, g); };
    Tensor y = checkpointed ? checkpoint(fn, {x0, x1}, {&gen})[0] : fn({x0, x1})[0];
    backward(sum(y * y));
    EXPECT_EQ(gen.offset, 4u) << (checkpointed ? "checkpointed" : "plain");
    return std::vector<std::vector<float>>{y.to_vector<float>(), grad(x0).to_vector<float>(),
                                           grad(x1).to_vector<float>(), grad(w).to_vector<float>()};
  };
  const auto plain = run(false), ckpt = run(true);
  const char* what[] = {"output", "d x0", "d x1", "d w"};
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(ckpt[i], plain[i]) << what[i];
}

// Data parallelism's hook points through a checkpoint: each param's
// AccumulateGrad hook and post-accumulate hook fire once, in the rerun's
// backward, and a callback queued there waits for the OUTER backward to end
// (after a, used before the region, has its gradient): DataParallelBucket's
// wait for its all-reduces must not run while gradients are still to come.
TEST(Checkpoint, HooksFireOnceAndQueuedCallbacksRunAfterTheOuterBackward) {
  Tensor a = leaf(tensor({0.5, -1.0}, {2}, kFloat64)), w = leaf(tensor({2.0, 3.0}, {2}, kFloat64));
  std::vector<std::string> log;
  auto acc_a = grad_accumulator(a), acc_w = grad_accumulator(w);
  RemovableHandle hook_a = acc_a->register_hook([&](Tensor&) { log.push_back("hook a"); });
  RemovableHandle hook_w = acc_w->register_hook([&](Tensor&) {
    log.push_back("hook w");
    Engine::queue_callback([&] { log.push_back("callback"); });
  });
  RemovableHandle post_w = register_post_accumulate_grad_hook(w, [&](Tensor&) { log.push_back("post w"); });
  Tensor x = a * 3.0;  // before the region: a's gradient arrives after the region's backward
  Tensor y = checkpoint([w](const TensorList& in) { return TensorList{in[0] * w}; }, {x})[0];
  backward(sum(y));
  EXPECT_EQ(log, (std::vector<std::string>{"hook w", "post w", "hook a", "callback"}));
  EXPECT_EQ(grad(w).to_vector<double>(), (std::vector<double>{1.5, -3.0}));
  EXPECT_EQ(grad(a).to_vector<double>(), (std::vector<double>{6.0, 9.0}));
  EXPECT_FALSE(Engine::in_backward());
}

TEST(Checkpoint, WithoutGradTheRegionRunsAsItIs) {
  Tensor x = leaf(tensor({1.0, 2.0}, {2}, kFloat64));
  int runs = 0;
  auto fn = [&runs](const TensorList& in) {
    ++runs;
    return TensorList{in[0] * 2.0};
  };
  NoGradGuard no_grad;
  Tensor y = checkpoint(fn, {x})[0];
  EXPECT_EQ(runs, 1);
  EXPECT_FALSE(requires_grad(y));
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{2.0, 4.0}));
}

TEST(Checkpoint, RunsTheRegionOnceMoreInBackwardAndABackwardTwiceIsAnError) {
  Tensor x = leaf(tensor({1.0, 2.0}, {2}, kFloat64));
  int runs = 0;
  auto fn = [&runs](const TensorList& in) {
    ++runs;
    return TensorList{in[0] * in[0]};
  };
  Tensor y = checkpoint(fn, {x})[0];
  Tensor loss = sum(y);
  EXPECT_EQ(runs, 1);
  backward(loss, /*retain_graph=*/true);
  EXPECT_EQ(runs, 2);
  EXPECT_EQ(grad(x).to_vector<double>(), (std::vector<double>{2.0, 4.0}));
  backward(loss);  // retained: runs the region again, and frees its inputs
  EXPECT_EQ(runs, 3);
  std::string msg = error_of([&] { backward(sum(y)); });
  EXPECT_NE(msg.find("checkpoint: backward ran twice"), std::string::npos) << msg;
}

// --recompute's models against the model without it, one process: the same
// parameter names in the same order, the same loss and every gradient to the
// bit, in fp32 and bf16, with dropout (so the reruns must draw the forward's masks).
struct ModelGrads {
  std::vector<std::string> names;
  double loss;
  std::vector<std::vector<float>> grads;
  uint64_t dropout_offset;
};

ModelGrads train_two_steps(parallel::Recompute mode, DType dtype, double p_dropout) {
  nn::GPTConfig cfg;
  cfg.vocab_size = 11, cfg.block_size = 8, cfg.n_layer = 2, cfg.n_head = 2, cfg.n_embd = 16, cfg.dropout = p_dropout;
  parallel::ModelChunks model(cfg, {0, cfg.num_layers()}, parallel::with_recompute({}, cfg, mode));
  model.to(dtype);
  model.train();
  Generator gen(3);
  Tensor ids = randint(0, cfg.vocab_size, {2, 8}, gen), targets = randint(0, cfg.vocab_size, {2, 8}, gen);
  ModelGrads out;
  for (int step = 0; step < 2; ++step) {  // the second step draws other masks: offsets must move on alike
    Tensor logits = model.forward(ids);
    Tensor loss = model.loss(logits, targets);
    out.loss = loss.item<double>();
    model.backward(ids, loss, Tensor());
  }
  for (const auto& [name, p] : model.named_parameters()) {
    out.names.push_back(name);
    out.grads.push_back(ops::to(grad(p), kFloat32).to_vector<float>());
  }
  out.dropout_offset = nn::dropout_offset(model);
  return out;
}

class RecomputeModel : public ::testing::TestWithParam<std::tuple<parallel::Recompute, DType, double>> {};

TEST_P(RecomputeModel, GradientsAreBitIdenticalToNone) {
  const auto [mode, dtype, p] = GetParam();
  const ModelGrads ref = train_two_steps(parallel::Recompute::None, dtype, p);
  const ModelGrads got = train_two_steps(mode, dtype, p);
  EXPECT_EQ(got.names, ref.names);
  EXPECT_EQ(got.loss, ref.loss);
  EXPECT_EQ(got.dropout_offset, ref.dropout_offset);
  ASSERT_EQ(got.grads.size(), ref.grads.size());
  for (size_t i = 0; i < ref.grads.size(); ++i) EXPECT_EQ(got.grads[i], ref.grads[i]) << ref.names[i];
}

INSTANTIATE_TEST_SUITE_P(
    Modes, RecomputeModel,
    ::testing::Combine(::testing::Values(parallel::Recompute::Selective, parallel::Recompute::Full),
                       ::testing::Values(kFloat32, kBFloat16), ::testing::Values(0.0, 0.3)),
    [](const auto& info) {  // full_bf16_dropout, ...
      return std::string(std::get<0>(info.param) == parallel::Recompute::Full ? "full" : "selective") +
             (std::get<1>(info.param) == kFloat32 ? "_fp32" : "_bf16") + (std::get<2>(info.param) > 0 ? "_dropout" : "");
    });

// The reruns happen, and draw their masks from the saved offsets: with
// --teach-break recompute-fresh-dropout (the offsets not put back) every mode
// gets gradients other than none's.
TEST(Recompute, AFreshDropoutMaskOnTheRerunChangesTheGradients) {
  const ModelGrads ref = train_two_steps(parallel::Recompute::None, kFloat32, 0.3);
  struct Break {
    Break() { teach::set_break(teach::Break::RecomputeFreshDropout); }
    ~Break() { teach::set_break(teach::Break::None); }
  };
  ModelGrads selective, full;
  {
    Break fresh_masks;
    selective = train_two_steps(parallel::Recompute::Selective, kFloat32, 0.3);
    full = train_two_steps(parallel::Recompute::Full, kFloat32, 0.3);
  }
  // The first block's c_attn weight: below both reruns' dropouts.
  const size_t i = size_t(std::find(ref.names.begin(), ref.names.end(), "blocks.0.attn.c_attn.weight") - ref.names.begin());
  ASSERT_LT(i, ref.names.size());
  EXPECT_NE(selective.grads[i], ref.grads[i]);
  EXPECT_NE(full.grads[i], ref.grads[i]);
  EXPECT_EQ(selective.loss, ref.loss);  // the forwards are untouched: the second one's loss still agrees
  EXPECT_EQ(full.loss, ref.loss);
}

TEST(Recompute, AnUnknownModeNamesTheThree) {
  std::string msg = error_of([] { parallel::parse_recompute("partial"); });
  EXPECT_NE(msg.find("--recompute 'partial': expected none, selective"), std::string::npos) << msg;
  EXPECT_EQ(parallel::parse_recompute("full"), parallel::Recompute::Full);
  EXPECT_EQ(parallel::parse_recompute("selective"), parallel::Recompute::Selective);
  EXPECT_EQ(parallel::parse_recompute("none"), parallel::Recompute::None);
}

}  // namespace
}  // namespace loom::test
