// Mixed precision, one process: the GradScaler, unscale_, Module::to, the
// MixedPrecisionOptimizer (fp32 main params, loss scaling, clipping, memory)
// and the shard arithmetic of the distributed optimizer (param_range_in_shard).
//
// References are independent of the code under test: hand-computed values, a
// bf16 rounding written here from its definition, and plain optim::AdamW run on
// fp32 tensors fed the gradients the mixed-precision optimizer should have used.
// AdamW and the optimizer's inner AdamW run the same fused kernel on the same
// fp32 numbers, so the comparisons are bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/variable.h"
#include "error_of.h"
#include "nn/gpt.h"
#include "nn/loss.h"
#include "optim/adamw.h"
#include "optim/distributed_optimizer.h"
#include "optim/grad_scaler.h"
#include "optim/mixed_precision_optimizer.h"
#include "tensor/ops.h"
#include "tensor/storage.h"

using namespace loom;
using loom::optim::AdamW;
using loom::optim::AdamWOptions;
using loom::optim::GradScaler;
using loom::optim::GradScalerOptions;
using loom::optim::MixedPrecisionOptimizer;
using loom::optim::MixedPrecisionOptions;
using loom::optim::ParamGroup;
using loom::optim::StepResult;
using loom::test::error_of;

namespace {

// ---- helpers ----------------------------------------------------------------------

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// bf16 is the top half of an fp32; round the dropped 16 bits to nearest, ties
// to even (finite inputs only).
float bf16_round(float f) {
  uint32_t u = bits(f);
  u += 0x7fffu + ((u >> 16) & 1u);
  return from_bits(u & 0xffff0000u);
}

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

// Bit-for-bit equality of two float vectors (so -0 != +0 and a NaN would fail).
void expect_bitwise_eq(const std::vector<float>& got, const std::vector<float>& expected, const std::string& what) {
  ASSERT_EQ(got.size(), expected.size()) << what;
  int mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (bits(got[i]) != bits(expected[i]) && ++mismatches <= 5)
      ADD_FAILURE() << what << " element " << i << ": got " << got[i] << ", expected " << expected[i];
  EXPECT_EQ(mismatches, 0) << what;
}

// A GradSource backed by a map the test fills: param impl -> fp32 gradient.
using GradMap = std::map<const TensorImpl*, Tensor>;
optim::Optimizer::GradSource source(GradMap& grads) {
  return [&grads](const Tensor& p) {
    auto it = grads.find(p.impl());
    return it == grads.end() ? Tensor() : it->second;
  };
}

Tensor fp32_copy(const Tensor& p) { return ops::clone(ops::to(autograd::detach(p), kFloat32)); }

int64_t live_bytes() { return memory_stats().live_bytes; }

// ---- GradScaler -------------------------------------------------------------------

TEST(GradScaler, StartsAt2To16) {
  GradScaler s;
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.inv_scale(), 1.0 / 65536.0);
  EXPECT_EQ(s.growth_tracker(), 0);
}

TEST(GradScaler, ScaleLossMultipliesTheLossAndItsGradient) {
  GradScaler s;  // 2^16
  Tensor x = tensor({0.75, -2.0});
  autograd::set_requires_grad(x);
  Tensor loss = s.scale_loss(autograd::sum(x));  // (0.75 - 2) * 2^16
  EXPECT_EQ(loss.item<double>(), -1.25 * 65536.0);
  autograd::backward(loss);
  EXPECT_EQ(autograd::grad(x).to_vector<double>(), (std::vector<double>{65536.0, 65536.0}));
}

TEST(GradScaler, OverflowHalvesTheScaleAndResetsTheTracker) {
  GradScaler s(GradScalerOptions{.growth_interval = 3});
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.growth_tracker(), 2);
  EXPECT_EQ(s.scale(), 65536.0);
  s.update(true);
  EXPECT_EQ(s.scale(), 32768.0);
  EXPECT_EQ(s.growth_tracker(), 0);
  s.update(true);
  EXPECT_EQ(s.scale(), 16384.0);
}

TEST(GradScaler, GrowsAfterExactlyGrowthIntervalCleanSteps) {
  GradScaler s(GradScalerOptions{.init_scale = 8.0, .growth_interval = 3});
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 8.0) << "2 of 3 clean steps";
  s.update(false);
  EXPECT_EQ(s.scale(), 16.0) << "3 of 3 clean steps";
  EXPECT_EQ(s.growth_tracker(), 0);
  // An overflow in the middle restarts the count.
  s.update(false);
  s.update(false);
  s.update(true);  // 16 -> 8
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 8.0);
  s.update(false);
  EXPECT_EQ(s.scale(), 16.0);
}

TEST(GradScaler, OverflowingAtEveryScaleStopsAtTheFloorNamingTheSkipsInARow) {
  // 2^4 with floor 1: four halvings reach 1 (skips 1..4), the fifth would go below.
  GradScaler s(GradScalerOptions{.init_scale = 16.0, .min_scale = 1.0});
  s.update(true);
  s.update(false);  // a clean step resets the count of skips in a row
  EXPECT_EQ(s.consecutive_skips(), 0);
  for (int i = 0; i < 3; ++i) s.update(true);
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_EQ(s.consecutive_skips(), 3);
  std::string err = error_of([&] { s.update(true); });
  EXPECT_NE(err.find("overflowed in 4 steps in a row"), std::string::npos) << err;
  EXPECT_NE(err.find("below its floor (1 x 0.5 < min_scale 1)"), std::string::npos) << err;
  EXPECT_EQ(s.scale(), 1.0) << "the scale is left as it was";
  EXPECT_NE(error_of([] { GradScaler(GradScalerOptions{.init_scale = 0.5}); }).find("min_scale"), std::string::npos);
}

TEST(GradScaler, StateDictRoundTrip) {
  GradScaler a(GradScalerOptions{.init_scale = 1024.0, .growth_interval = 3});
  a.update(true);   // 512
  a.update(false);  // tracker 1
  a.update(false);  // tracker 2
  optim::NamedTensors state = a.state_dict();

  GradScaler b(GradScalerOptions{.init_scale = 4.0, .growth_interval = 3});
  b.load_state_dict(state);
  EXPECT_EQ(b.scale(), 512.0);
  EXPECT_EQ(b.growth_tracker(), 2);
  b.update(false);  // the third clean step: grows
  EXPECT_EQ(b.scale(), 1024.0);
  EXPECT_EQ(b.growth_tracker(), 0);

  optim::NamedTensors missing = {state[0]};  // "scale" only
  EXPECT_NE(error_of([&] { b.load_state_dict(missing); }).find("growth_tracker"), std::string::npos);
}

TEST(GradScaler, RejectsBadOptions) {
  auto error = [](GradScalerOptions o) { return error_of([&] { GradScaler s(o); }); };
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_NE(error({.init_scale = 0}).find("init_scale"), std::string::npos);
  EXPECT_NE(error({.init_scale = -1}).find("init_scale"), std::string::npos);
  EXPECT_NE(error({.init_scale = inf}).find("init_scale"), std::string::npos);
  EXPECT_NE(error({.growth_factor = 1.0}).find("growth_factor"), std::string::npos);
  EXPECT_NE(error({.backoff_factor = 1.0}).find("backoff_factor"), std::string::npos);
  EXPECT_NE(error({.backoff_factor = 0.0}).find("backoff_factor"), std::string::npos);
  EXPECT_NE(error({.growth_interval = 0}).find("growth_interval"), std::string::npos);
}

// ---- unscale_ ---------------------------------------------------------------------

TEST(Unscale, MultipliesByInvScaleExactly) {
  // Multiplying by a power of two is exact in fp32 (no exponent under/overflow here).
  Tensor a = tensor({1.5, -3.0, 0.25, 1e-3});
  Tensor b = tensor({65536.0, -7.0, 0.0}, {3, 1});
  EXPECT_FALSE(optim::unscale_({a, b}, 1.0 / 1024.0));
  expect_bitwise_eq(values(a), {1.5f / 1024, -3.0f / 1024, 0.25f / 1024, 1e-3f / 1024}, "a");
  expect_bitwise_eq(values(b), {64.0f, -7.0f / 1024, 0.0f}, "b");
}

TEST(Unscale, FlagsInfAndNan) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(optim::unscale_({tensor({1.0, 2.0}), tensor({3.0, inf})}, 0.5));
  EXPECT_TRUE(optim::unscale_({tensor({-inf, 2.0})}, 0.5));
  EXPECT_TRUE(optim::unscale_({tensor({1.0}), tensor({nan, 2.0}), tensor({4.0})}, 0.5));
  EXPECT_FALSE(optim::unscale_({tensor({1.0}), tensor({3.4e38, -3.4e38})}, 0.5)) << "large but finite";
  EXPECT_FALSE(optim::unscale_({}, 0.5));
}

TEST(Unscale, RejectsANonFp32Tensor) {
  Tensor g = ops::to(tensor({1.0, 2.0}), kBFloat16);
  std::string e = error_of([&] { optim::unscale_({g}, 0.5); });
  EXPECT_NE(e.find("unscale_"), std::string::npos) << e;
  EXPECT_NE(e.find("bfloat16"), std::string::npos) << e;
}

// ---- Module::to -------------------------------------------------------------------

TEST(ModuleTo, CastsAGptToBf16InPlace) {
  nn::GPTConfig cfg;
  cfg.vocab_size = 11;
  cfg.block_size = 8;
  cfg.n_layer = 1;
  cfg.n_head = 2;
  cfg.n_embd = 8;
  auto gpt = std::make_shared<nn::GPT>(cfg);
  nn::NamedTensors params = gpt->named_parameters();
  std::vector<std::vector<float>> fp32;
  for (auto& [name, p] : params) fp32.push_back(values(p));
  ASSERT_TRUE(gpt->embedding()->wte->weight.is_same(gpt->head()->wte->weight)) << "the GPT ties wte";

  gpt->to(kBFloat16);

  nn::NamedTensors after = gpt->named_parameters();
  ASSERT_EQ(after.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    EXPECT_TRUE(after[i].second.is_same(p)) << name << " kept its identity";
    ASSERT_EQ(p.dtype(), kBFloat16) << name;
    std::vector<float> expected;
    for (float x : fp32[i]) expected.push_back(bf16_round(x));
    expect_bitwise_eq(values(p), expected, name);
  }
  // The tied weight is still one tensor, shared by the embedding and the head.
  const Tensor& wte = gpt->embedding()->wte->weight;
  EXPECT_TRUE(wte.is_same(gpt->head()->wte->weight));
  EXPECT_EQ(gpt->head()->wte->weight.dtype(), kBFloat16);

  // Forward and backward run, every param gets a finite bf16 gradient.
  Generator g(5);
  Tensor idx = randint(0, cfg.vocab_size, {2, 5}, g);
  Tensor targets = randint(0, cfg.vocab_size, {2, 5}, g);
  Tensor logits = gpt->forward(idx);
  EXPECT_EQ(logits.dtype(), kBFloat16);
  EXPECT_EQ(logits.shape(), (Shape{2, 5, cfg.vocab_size}));
  Tensor loss = nn::cross_entropy_loss(logits, targets);
  EXPECT_TRUE(std::isfinite(loss.item<double>()));
  EXPECT_NEAR(loss.item<double>(), std::log(double(cfg.vocab_size)), 0.5) << "small init: near log V";
  autograd::backward(loss);
  for (const auto& [name, p] : params) {
    Tensor gr = autograd::grad(p);
    ASSERT_TRUE(gr.defined()) << name;
    EXPECT_EQ(gr.dtype(), kBFloat16) << name;
    for (float x : values(gr)) ASSERT_TRUE(std::isfinite(x)) << name;
  }
  double wte_grad_norm = 0;
  for (float x : values(autograd::grad(wte))) wte_grad_norm += double(x) * x;
  EXPECT_GT(wte_grad_norm, 0.0);
}

// ---- MixedPrecisionOptimizer ------------------------------------------------------

constexpr AdamWOptions kAdam{0.8, 0.95, 1e-8};

TEST(MixedPrecisionOptimizer, Bf16MainParamsMatchFp32AdamWBitForBit) {
  Generator gen(11);
  // The model: two bf16 params, in a decay and a no-decay group.
  Tensor w = ops::to(randn({4, 6}, gen), kBFloat16);
  Tensor b = ops::to(randn({5}, gen), kBFloat16);
  // The reference: fp32 tensors holding the same values (bf16 -> fp32 is exact).
  Tensor w_ref = fp32_copy(w), b_ref = fp32_copy(b);

  const double lr = 1e-2;
  GradMap grads, ref_grads;
  MixedPrecisionOptions o;
  o.adam = kAdam;
  MixedPrecisionOptimizer opt({{{w}, lr, 0.1, "decay"}, {{b}, lr, 0.0, "no_decay"}}, o, source(grads));
  AdamW ref({{{w_ref}, lr, 0.1, "decay"}, {{b_ref}, lr, 0.0, "no_decay"}}, kAdam);
  ref.set_grad_source(source(ref_grads));
  ASSERT_EQ(opt.main_params().size(), 2u);
  const Tensor& w_main = opt.main_params()[0].main;
  const Tensor& b_main = opt.main_params()[1].main;
  expect_bitwise_eq(values(w_main), values(w_ref), "w main at start");

  for (int step = 1; step <= 5; ++step) {
    Tensor gw = randn({4, 6}, gen), gb = randn({5}, gen);
    grads[w.impl()] = gw;
    grads[b.impl()] = gb;
    ref_grads[w_ref.impl()] = ops::clone(gw);
    ref_grads[b_ref.impl()] = ops::clone(gb);
    StepResult r = opt.step();
    ref.step();
    EXPECT_FALSE(r.skipped);
    EXPECT_EQ(r.loss_scale, 1.0);
    const std::string at = " after step " + std::to_string(step);
    expect_bitwise_eq(values(w_main), values(w_ref), "w main" + at);
    expect_bitwise_eq(values(b_main), values(b_ref), "b main" + at);
    // The model params are the main params rounded to nearest bf16.
    std::vector<float> w_rounded, b_rounded;
    for (float x : values(w_main)) w_rounded.push_back(bf16_round(x));
    for (float x : values(b_main)) b_rounded.push_back(bf16_round(x));
    EXPECT_EQ(w.dtype(), kBFloat16);
    expect_bitwise_eq(values(w), w_rounded, "w model" + at);
    expect_bitwise_eq(values(b), b_rounded, "b model" + at);
  }
  EXPECT_EQ(opt.adam_state(0).step.item<int64_t>(), 5);
  EXPECT_EQ(opt.adam_state(1).step.item<int64_t>(), 5);
}

// Adam's first steps with a constant gradient move each weight by lr (m/sqrt(v)
// = g/|g|). With lr = 5e-4 that is below half a bf16 ulp of every value here
// (bf16 has 8 significant bits: the gap just below 1 is 2^-8, so half an ulp
// is 2^-9 ~ 1.95e-3; just below 0.5 it is 2^-10 ~ 9.8e-4; below 2, 3.9e-3),
// so a bf16 param stepped by plain AdamW rounds back to itself every step.
TEST(MixedPrecisionOptimizer, MainParamsKeepUpdatesBelowHalfABf16Ulp) {
  const std::vector<double> start = {1.0, 2.0, 0.5, -1.0};
  const double lr = 5e-4;
  const int steps = 40;
  Tensor plain = ops::to(from_vector<double>(start), kBFloat16);
  Tensor model = ops::to(from_vector<double>(start), kBFloat16);
  GradMap plain_grads, grads;
  AdamW plain_adam({{{plain}, lr, 0.0, ""}});
  plain_adam.set_grad_source(source(plain_grads));
  MixedPrecisionOptimizer opt({{{model}, lr, 0.0, ""}}, {}, source(grads));
  for (int s = 0; s < steps; ++s) {
    plain_grads[plain.impl()] = tensor({1.0, 1.0, 1.0, 1.0});  // every weight is pushed down
    grads[model.impl()] = tensor({1.0, 1.0, 1.0, 1.0});
    plain_adam.step();
    opt.step();
  }
  // Plain AdamW on bf16: stalled, bit for bit.
  expect_bitwise_eq(values(plain), {1.0f, 2.0f, 0.5f, -1.0f}, "plain AdamW on bf16");
  // The main params moved by ~steps * lr = 0.02 each.
  std::vector<float> main = values(opt.main_params()[0].main);
  for (size_t i = 0; i < start.size(); ++i) {
    EXPECT_NEAR(main[i], start[i] - steps * lr, 2e-5) << i;
    EXPECT_EQ(values(model)[i], bf16_round(main[i])) << i;
    EXPECT_LT(values(model)[i], start[i]) << "the bf16 model param moved too, element " << i;
  }
}

// fp32 model: the main param is the param (Megatron's FP32Optimizer), so the
// only new memory is exp_avg + exp_avg_sq (8 bytes a param) and one int64 step
// counter per param.
TEST(MixedPrecisionOptimizer, Fp32ParamsAreTheirOwnMainParams) {
  Generator gen(3);
  Tensor a = randn({100}, gen), b = randn({7, 9}, gen), c = randn({3}, gen);
  const int64_t n = 100 + 63 + 3;
  GradMap grads;
  const int64_t before = live_bytes();
  {
    MixedPrecisionOptimizer opt({{{a, b}, 1e-3, 0.1, "decay"}, {{c}, 1e-3, 0.0, "no_decay"}}, {}, source(grads));
    EXPECT_EQ(live_bytes() - before, 8 * n + 8 * 3);
    for (const optim::MainParam& m : opt.main_params()) {
      EXPECT_EQ(m.main.storage(), m.model_param.storage()) << m.model_param.describe();
      EXPECT_EQ(m.main.raw_data(), m.model_param.raw_data()) << m.model_param.describe();
      EXPECT_EQ(m.main.numel(), m.model_param.numel());
    }
  }
  EXPECT_EQ(live_bytes(), before) << "the optimizer's state is freed with it";
}

// bf16 model: fp32 main params (4) + exp_avg + exp_avg_sq (8) = 12 bytes a param.
TEST(MixedPrecisionOptimizer, Bf16ParamsCost12BytesAParam) {
  Generator gen(4);
  Tensor a = ops::to(randn({100}, gen), kBFloat16), b = ops::to(randn({7, 9}, gen), kBFloat16);
  const int64_t n = 100 + 63;
  GradMap grads;
  const int64_t before = live_bytes();
  MixedPrecisionOptimizer opt({{{a}, 1e-3, 0.1, "decay"}, {{b}, 1e-3, 0.0, "no_decay"}}, {}, source(grads));
  EXPECT_EQ(live_bytes() - before, 12 * n + 8 * 2);
  for (const optim::MainParam& m : opt.main_params()) EXPECT_NE(m.main.storage(), m.model_param.storage());
}

// fp16 with loss scaling: a clean step, an overflowing one (skipped, scale
// halved, nothing touched), a clean one at the halved scale. The reference
// AdamW sees the true (unscaled) gradients of the two clean steps only.
TEST(MixedPrecisionOptimizer, LossScalingSkipsAnOverflowingStep) {
  Generator gen(21);
  Tensor p = ops::to(randn({6}, gen), kFloat16), q = ops::to(randn({2, 3}, gen), kFloat16);
  Tensor p_ref = fp32_copy(p), q_ref = fp32_copy(q);
  const double lr = 1e-2;
  GradMap grads, ref_grads;
  MixedPrecisionOptions o;
  o.adam = kAdam;
  o.loss_scaling = true;
  o.scaler = GradScalerOptions{.init_scale = 1024.0, .growth_interval = 1000};
  MixedPrecisionOptimizer opt({{{p}, lr, 0.1, "decay"}, {{q}, lr, 0.0, "no_decay"}}, o, source(grads));
  AdamW ref({{{p_ref}, lr, 0.1, "decay"}, {{q_ref}, lr, 0.0, "no_decay"}}, kAdam);
  ref.set_grad_source(source(ref_grads));

  // The true gradients, and what backward of (loss * scale) would give: times a
  // power of two, exact in fp32.
  auto feed = [&](double scale, bool overflow) {
    Tensor gp = randn({6}, gen), gq = randn({2, 3}, gen);
    ref_grads[p_ref.impl()] = gp;
    ref_grads[q_ref.impl()] = gq;
    grads[p.impl()] = ops::mul(gp, scale);
    grads[q.impl()] = ops::mul(gq, scale);
    if (overflow) ops::fill_(ops::narrow(ops::view(grads[q.impl()], {6}), 0, 4, 1), INFINITY);
    double norm = 0;
    for (float x : values(gp)) norm += double(x) * x;
    for (float x : values(gq)) norm += double(x) * x;
    return std::sqrt(norm);
  };

  // 1. Clean at 1024.
  double norm1 = feed(1024.0, false);
  StepResult r1 = opt.step();
  ref.step();
  EXPECT_FALSE(r1.skipped);
  EXPECT_EQ(r1.loss_scale, 1024.0);
  EXPECT_NEAR(r1.grad_norm, norm1, 1e-12 * norm1) << "the norm of the unscaled gradient";
  expect_bitwise_eq(values(opt.main_params()[0].main), values(p_ref), "p main after step 1");

  // 2. An inf in q's gradient: skipped.
  std::vector<std::vector<float>> snapshot;
  auto state = [&] {
    std::vector<std::vector<float>> s = {values(p), values(q)};
    for (size_t i = 0; i < 2; ++i) {
      s.push_back(values(opt.main_params()[i].main));
      s.push_back(values(opt.adam_state(i).exp_avg));
      s.push_back(values(opt.adam_state(i).exp_avg_sq));
    }
    return s;
  };
  snapshot = state();
  feed(1024.0, true);
  StepResult r2 = opt.step();
  EXPECT_TRUE(r2.skipped);
  EXPECT_EQ(r2.loss_scale, 1024.0) << "the scale this step's gradients carried";
  EXPECT_EQ(opt.scaler()->scale(), 512.0);
  std::vector<std::vector<float>> now = state();
  for (size_t i = 0; i < snapshot.size(); ++i) expect_bitwise_eq(now[i], snapshot[i], "state " + std::to_string(i));
  EXPECT_EQ(opt.adam_state(0).step.item<int64_t>(), 1);
  EXPECT_EQ(opt.adam_state(1).step.item<int64_t>(), 1);

  // 3. Clean at the halved scale: updates with the unscaled gradient.
  feed(512.0, false);
  StepResult r3 = opt.step();
  ref.step();
  EXPECT_FALSE(r3.skipped);
  EXPECT_EQ(r3.loss_scale, 512.0);
  EXPECT_EQ(opt.adam_state(0).step.item<int64_t>(), 2);
  expect_bitwise_eq(values(opt.main_params()[0].main), values(p_ref), "p main after step 3");
  expect_bitwise_eq(values(opt.main_params()[1].main), values(q_ref), "q main after step 3");
  // The fp16 model params are the main params rounded to fp16.
  expect_bitwise_eq(values(p), values(ops::to(p_ref, kFloat16)), "p model");
  expect_bitwise_eq(values(q), values(ops::to(q_ref, kFloat16)), "q model");
}

// Grads a = (3, 4, 0, 0), b = (12, 0, 0): norm sqrt(9 + 16 + 144) = 13. c is a
// duplicate copy (a tied weight's second home) left out of the norm but still
// clipped with the others.
struct ClipCase {
  Tensor a = tensor({0.5, -1.0, 2.0, 0.25});
  Tensor b = tensor({1.0, 0.0, -0.5});
  Tensor c = tensor({0.125, 3.0});
  std::vector<std::vector<float>> raw = {{3, 4, 0, 0}, {12, 0, 0}, {100, -100}};
  GradMap grads;
  std::vector<Tensor> params() const { return {a, b, c}; }
  void fill_grads() {
    std::vector<Tensor> ps = params();
    for (size_t i = 0; i < 3; ++i) grads[ps[i].impl()] = from_vector<float>(raw[i]);
  }
};

// AdamW on fp32 copies of the case's params, fed the given gradients once.
std::vector<std::vector<float>> adamw_once(const ClipCase& k, const std::vector<std::vector<float>>& g) {
  std::vector<Tensor> ref = {ops::clone(k.a), ops::clone(k.b), ops::clone(k.c)};
  GradMap ref_grads;
  for (size_t i = 0; i < 3; ++i) ref_grads[ref[i].impl()] = from_vector<float>(g[i]);
  AdamW adam({{{ref[0], ref[1]}, 1e-2, 0.1, "decay"}, {{ref[2]}, 1e-2, 0.0, "no_decay"}}, kAdam);
  adam.set_grad_source(source(ref_grads));
  adam.step();
  return {values(ref[0]), values(ref[1]), values(ref[2])};
}

TEST(MixedPrecisionOptimizer, ClipsTheMainGradsToMaxGradNorm) {
  ClipCase k;
  std::vector<std::vector<float>> expected_params = {};
  // torch.nn.utils.clip_grad_norm_: g *= max / (norm + 1e-6), the factor in fp32.
  const float coef = float(6.5 / (13.0 + 1e-6));
  std::vector<std::vector<float>> clipped = k.raw;
  for (auto& g : clipped)
    for (float& x : g) x *= coef;
  expected_params = adamw_once(k, clipped);

  MixedPrecisionOptions o;
  o.adam = kAdam;
  o.max_grad_norm = 6.5;
  o.not_counted = {k.c};
  MixedPrecisionOptimizer opt({{{k.a, k.b}, 1e-2, 0.1, "decay"}, {{k.c}, 1e-2, 0.0, "no_decay"}}, o,
                              source(k.grads));
  k.fill_grads();
  StepResult r = opt.step();
  EXPECT_EQ(r.grad_norm, 13.0) << "c is not counted: sqrt(9 + 16 + 144)";
  std::vector<Tensor> ps = k.params();
  for (size_t i = 0; i < 3; ++i) {
    expect_bitwise_eq(values(k.grads[ps[i].impl()]), clipped[i], "clipped main grad " + std::to_string(i));
    expect_bitwise_eq(values(ps[i]), expected_params[i], "param " + std::to_string(i));
  }
  EXPECT_FALSE(opt.main_params()[2].counted_in_norm);
}

TEST(MixedPrecisionOptimizer, NormBelowMaxGradNormLeavesTheGradsAlone) {
  ClipCase k;
  std::vector<std::vector<float>> expected_params = adamw_once(k, k.raw);
  MixedPrecisionOptions o;
  o.adam = kAdam;
  o.max_grad_norm = 13.5;
  o.not_counted = {k.c};  // with c counted the norm would be ~143
  MixedPrecisionOptimizer opt({{{k.a, k.b}, 1e-2, 0.1, "decay"}, {{k.c}, 1e-2, 0.0, "no_decay"}}, o,
                              source(k.grads));
  k.fill_grads();
  StepResult r = opt.step();
  EXPECT_EQ(r.grad_norm, 13.0);
  std::vector<Tensor> ps = k.params();
  for (size_t i = 0; i < 3; ++i) {
    expect_bitwise_eq(values(k.grads[ps[i].impl()]), k.raw[i], "main grad " + std::to_string(i));
    expect_bitwise_eq(values(ps[i]), expected_params[i], "param " + std::to_string(i));
  }
}

// ---- param_range_in_shard ---------------------------------------------------------

void expect_range(optim::Range r, int64_t start, int64_t end, const std::string& what) {
  EXPECT_EQ(r.start, start) << what;
  EXPECT_EQ(r.end, end) << what;
}

TEST(ParamRangeInShard, MapsAParamToTheShardItOverlaps) {
  const optim::Range shard{100, 200};
  // Entirely inside: buffer [120, 150).
  optim::ParamRange in = optim::param_range_in_shard(120, 30, shard);
  expect_range(in.gbuf_world, 120, 150, "inside world");
  expect_range(in.gbuf_local, 20, 50, "inside local");
  expect_range(in.param, 0, 30, "inside param");
  // Straddling the shard's start: buffer [90, 120), its last 20 elements owned.
  optim::ParamRange head = optim::param_range_in_shard(90, 30, shard);
  expect_range(head.gbuf_world, 100, 120, "start world");
  expect_range(head.gbuf_local, 0, 20, "start local");
  expect_range(head.param, 10, 30, "start param");
  // Straddling the shard's end: buffer [180, 230), its first 20 elements owned.
  optim::ParamRange tail = optim::param_range_in_shard(180, 50, shard);
  expect_range(tail.gbuf_world, 180, 200, "end world");
  expect_range(tail.gbuf_local, 80, 100, "end local");
  expect_range(tail.param, 0, 20, "end param");
  // Covering the whole shard: buffer [50, 350).
  optim::ParamRange whole = optim::param_range_in_shard(50, 300, shard);
  expect_range(whole.gbuf_world, 100, 200, "cover world");
  expect_range(whole.gbuf_local, 0, 100, "cover local");
  expect_range(whole.param, 50, 150, "cover param");
  // Exactly the shard.
  optim::ParamRange exact = optim::param_range_in_shard(100, 100, shard);
  expect_range(exact.gbuf_world, 100, 200, "exact world");
  expect_range(exact.param, 0, 100, "exact param");
}

TEST(ParamRangeInShard, ParamsOutsideTheShardGetEmptyRanges) {
  const optim::Range shard{100, 200};
  // Before, ending exactly at the shard start; after, starting exactly at its end; far off.
  for (auto [start, numel] : {std::pair<int64_t, int64_t>{90, 10}, {200, 10}, {10, 50}, {500, 7}}) {
    optim::ParamRange r = optim::param_range_in_shard(start, numel, shard);
    const std::string what = "param [" + std::to_string(start) + ", " + std::to_string(start + numel) + ")";
    EXPECT_EQ(r.gbuf_world.size(), 0) << what;
    EXPECT_EQ(r.gbuf_local.size(), 0) << what;
    EXPECT_EQ(r.param.size(), 0) << what;
  }
}

}  // namespace
