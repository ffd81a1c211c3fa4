// optim/: SGD, AdamW, state dicts, gradient clipping and the LR schedule,
// checked against scalar reference implementations written here in double
// (independent of loom's tensor code), hand-computed values, and a few numbers
// from PyTorch's own torch.optim.AdamW.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "optim/lr_schedule.h"
#include "optim/sgd.h"
#include "tensor/kernels/adamw.h"
#include "tensor/ops.h"

using namespace loom;
using loom::optim::AdamW;
using loom::optim::AdamWOptions;
using loom::optim::NamedTensors;
using loom::optim::ParamGroup;
using loom::optim::SGD;
using loom::optim::SGDOptions;

namespace {

// ---- helpers ----------------------------------------------------------------------

// The value a double takes once stored as fp32 (what loom's tensors hold).
double f32(double x) { return double(float(x)); }
std::vector<double> f32(std::vector<double> xs) {
  for (double& x : xs) x = f32(x);
  return xs;
}

Tensor param(const std::vector<double>& values) {
  std::vector<float> v(values.begin(), values.end());
  Tensor p = from_vector<float>(v);
  autograd::set_requires_grad(p);
  return p;
}

void set_grad(const Tensor& p, const std::vector<double>& g) {
  std::vector<float> v(g.begin(), g.end());
  autograd::set_grad(p, from_vector<float>(v, p.shape()));
}

void expect_near(const Tensor& t, const std::vector<double>& expected, double tol, const std::string& what) {
  std::vector<double> got = t.to_vector<double>();
  ASSERT_EQ(got.size(), expected.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], tol) << what << " element " << i;
}

// Gradient of step t (1-based): a fixed pattern that changes sign and size.
std::vector<double> grad_at(int t) { return f32({0.1 * t, -0.2, 0.3 / t, 1e-3 * (t % 2 ? -1 : 1), 0.0}); }
const std::vector<double> kP0 = f32({0.5, -1.0, 2.0, 0.0, 3.0});

// ---- scalar references in double --------------------------------------------------

// torch.optim.SGD, written from its documentation: the momentum buffer is the
// first step's d itself, then buf = momentum * buf + d.
struct RefSGD {
  double lr, momentum = 0, weight_decay = 0;
  bool nesterov = false;
  std::vector<double> p, buf;
  bool first = true;
  void step(const std::vector<double>& g) {
    for (size_t i = 0; i < p.size(); ++i) {
      double d = g[i] + weight_decay * p[i];
      if (momentum != 0) {
        buf[i] = first ? d : momentum * buf[i] + d;
        d = nesterov ? d + momentum * buf[i] : buf[i];
      }
      p[i] -= lr * d;
    }
    first = false;
  }
};

// AdamW in the paper's form: bias-corrected m_hat, v_hat, eps outside the sqrt.
struct RefAdamW {
  double lr, weight_decay = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  std::vector<double> p = {}, m = {}, v = {};
  int t = 0;
  void step(const std::vector<double>& g) {
    if (m.empty()) m.assign(p.size(), 0.0), v.assign(p.size(), 0.0);
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] -= lr * weight_decay * p[i];
      m[i] = beta1 * m[i] + (1 - beta1) * g[i];
      v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
      double m_hat = m[i] / (1 - std::pow(beta1, t));
      double v_hat = v[i] / (1 - std::pow(beta2, t));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

// Runs `steps` SGD steps in loom and in the reference, comparing after each.
void check_sgd(double lr, SGDOptions opts, double weight_decay, int steps) {
  Tensor p = param(kP0);
  SGD sgd({{.params = {p}, .lr = lr, .weight_decay = weight_decay}}, opts);
  RefSGD ref{.lr = lr, .momentum = opts.momentum, .weight_decay = weight_decay, .nesterov = opts.nesterov, .p = kP0,
             .buf = std::vector<double>(kP0.size())};
  for (int t = 1; t <= steps; ++t) {
    set_grad(p, grad_at(t));
    sgd.step();
    ref.step(grad_at(t));
    expect_near(p, ref.p, 1e-6, "SGD step " + std::to_string(t));
  }
}

}  // namespace

// ---- the AdamW element kernel --------------------------------------------------------

TEST(AdamWKernel, FirstStepMovesByLrTimesSignOfGradient) {
  // Step 1 from m = v = 0: m_hat = g, v_hat = g^2, so the update is lr * g / (|g| + eps).
  for (double g : {0.5, -2.0, 1e-3}) {
    double p = 1.0, m = 0, v = 0;
    auto s = kernels::adamw_scalars<double>(0.1, 0.9, 0.999, 1e-8, 0.0, 1);
    kernels::adamw_update(p, m, v, g, s);
    EXPECT_NEAR(p, 1.0 - 0.1 * g / (std::abs(g) + 1e-8), 1e-15) << "g = " << g;
    EXPECT_NEAR(m, 0.1 * g, 1e-15);
    EXPECT_NEAR(v, 0.001 * g * g, 1e-15);
  }
}

TEST(AdamWKernel, WeightDecayIsAppliedToTheParamBeforeTheAdamUpdate) {
  // lr 0.1, wd 0.5: p = 2 * (1 - 0.05) = 1.9, then minus lr * g / (|g| + eps).
  double p = 2.0, m = 0, v = 0;
  auto s = kernels::adamw_scalars<double>(0.1, 0.9, 0.999, 1e-8, 0.5, 1);
  kernels::adamw_update(p, m, v, 4.0, s);
  EXPECT_NEAR(p, 1.9 - 0.1 * 4.0 / (4.0 + 1e-8), 1e-15);
}

TEST(AdamWKernel, BiasCorrectionScalars) {
  auto s = kernels::adamw_scalars<double>(1e-3, 0.9, 0.999, 1e-8, 0.1, 3);
  EXPECT_NEAR(s.step_size, 1e-3 / (1 - 0.729), 1e-15);
  EXPECT_NEAR(s.bias_correction2_sqrt, std::sqrt(1 - 0.999 * 0.999 * 0.999), 1e-15);
  EXPECT_NEAR(s.decay, 1 - 1e-4, 1e-15);
}

// ---- SGD ---------------------------------------------------------------------------

TEST(SGD, PlainStepIsPMinusLrTimesGrad) {
  // By hand, one step: p = [1, 2] - 0.5 * [0.5, -4] = [0.75, 4].
  Tensor p = param({1, 2});
  SGD sgd({{.params = {p}, .lr = 0.5}});
  set_grad(p, {0.5, -4});
  sgd.step();
  expect_near(p, {0.75, 4.0}, 0, "plain SGD");
  check_sgd(0.1, {}, 0.0, 3);
}

TEST(SGD, MomentumMatchesReferenceFor3Steps) { check_sgd(0.1, {.momentum = 0.9}, 0.0, 3); }

TEST(SGD, NesterovMatchesReferenceFor3Steps) { check_sgd(0.1, {.momentum = 0.9, .nesterov = true}, 0.0, 3); }

TEST(SGD, WeightDecayIsL2AddedToTheGradient) {
  // By hand: p = 2, g = 1, wd = 0.5, lr = 0.1: p = 2 - 0.1 * (1 + 0.5 * 2) = 1.8.
  Tensor p = param({2});
  SGD sgd({{.params = {p}, .lr = 0.1, .weight_decay = 0.5}});
  set_grad(p, {1});
  sgd.step();
  expect_near(p, {1.8}, 1e-7, "SGD weight decay");
  check_sgd(0.1, {}, 0.01, 3);
  check_sgd(0.1, {.momentum = 0.9}, 0.01, 3);
  check_sgd(0.1, {.momentum = 0.9, .nesterov = true}, 0.01, 3);
}

TEST(SGD, NesterovWithoutMomentumIsAnError) {
  Tensor p = param({1});
  EXPECT_THROW(SGD({{.params = {p}}}, {.nesterov = true}), Error);
}

// ---- AdamW ----------------------------------------------------------------------

TEST(AdamW, FiveStepsWithWeightDecayMatchReference) {
  Tensor p = param(kP0);
  AdamW adam({{.params = {p}, .lr = 0.01, .weight_decay = 0.1}});
  RefAdamW ref{.lr = 0.01, .weight_decay = 0.1, .p = kP0};
  for (int t = 1; t <= 5; ++t) {
    set_grad(p, grad_at(t));
    adam.step();
    ref.step(grad_at(t));
    expect_near(p, ref.p, 1e-6, "AdamW step " + std::to_string(t));
    expect_near(adam.state(0, 0).exp_avg, ref.m, 1e-7, "exp_avg step " + std::to_string(t));
    expect_near(adam.state(0, 0).exp_avg_sq, ref.v, 1e-9, "exp_avg_sq step " + std::to_string(t));
    EXPECT_EQ(adam.state(0, 0).step.item<int64_t>(), t);
  }
}

TEST(AdamW, FiveStepsMatchPyTorch) {
  // Produced by Debian's python3-torch 1.13 (torch.optim.AdamW, fp32):
  //   import torch
  //   p = torch.tensor([0.5, -1.0, 2.0, 0.0, 3.0], dtype=torch.float32, requires_grad=True)
  //   opt = torch.optim.AdamW([p], lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
  //   for t in range(1, 6):
  //       p.grad = torch.tensor([0.1 * t, -0.2, 0.3 / t, 1e-3 * (-1) ** t, 0.0], dtype=torch.float32)
  //       opt.step()
  //   print(", ".join("%.9gf" % x for x in p.detach().tolist()))
  const std::vector<double> torch_p = {0.449094355f, -0.945110023f, 1.94609904f, 0.0143047599f, 2.98503017f};
  Tensor p = param(kP0);
  AdamW adam({{.params = {p}, .lr = 0.01, .weight_decay = 0.1}});
  for (int t = 1; t <= 5; ++t) {
    set_grad(p, grad_at(t));
    adam.step();
  }
  expect_near(p, torch_p, 1e-6, "AdamW vs PyTorch");
}

TEST(AdamW, ParamsWithoutGradAreUntouched) {
  Tensor a = param({1, 2, 3});
  Tensor b = param({4, 5});
  AdamW adam({{.params = {a, b}, .lr = 0.1, .weight_decay = 0.5}});
  for (int t = 0; t < 3; ++t) {
    set_grad(a, {0.1, 0.2, 0.3});
    adam.step();
  }
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{4, 5}));  // not even weight decay
  EXPECT_EQ(adam.state(0, 1).step.item<int64_t>(), 0);
  EXPECT_EQ(adam.state(0, 1).exp_avg.to_vector<float>(), (std::vector<float>{0, 0}));
  EXPECT_EQ(adam.state(0, 0).step.item<int64_t>(), 3);
  // A param whose grad appears late gets its own bias correction from step 1.
  set_grad(b, {1, -1});
  adam.step();
  RefAdamW ref{.lr = 0.1, .weight_decay = 0.5, .p = {4, 5}};
  ref.step({1, -1});
  expect_near(b, ref.p, 1e-6, "late param");
}

TEST(AdamW, ParamGroupsUseTheirOwnLrAndWeightDecay) {
  Tensor a = param(kP0), b = param(kP0);
  AdamW adam({{.params = {a}, .lr = 0.01, .weight_decay = 0.1, .name = "decay"},
              {.params = {b}, .lr = 0.05, .weight_decay = 0.0, .name = "no_decay"}});
  RefAdamW ra{.lr = 0.01, .weight_decay = 0.1, .p = kP0}, rb{.lr = 0.05, .weight_decay = 0.0, .p = kP0};
  for (int t = 1; t <= 3; ++t) {
    set_grad(a, grad_at(t));
    set_grad(b, grad_at(t));
    adam.step();
    ra.step(grad_at(t));
    rb.step(grad_at(t));
  }
  expect_near(a, ra.p, 1e-6, "group 0");
  expect_near(b, rb.p, 1e-6, "group 1");
  // set_lr changes every group.
  adam.set_lr(0.02);
  EXPECT_EQ(adam.param_groups()[0].lr, 0.02);
  EXPECT_EQ(adam.param_groups()[1].lr, 0.02);
}

TEST(AdamW, Bfloat16ParamsAreUpdatedInFp32AndRounded) {
  // One step: p = 1.5 - 0.01 * sign(g) = 1.49 -> nearest bf16 (8 significant bits: step 2^-7).
  Tensor p = ops::to(from_vector<float>({1.5f, -0.75f}), kBFloat16);
  autograd::set_requires_grad(p);
  AdamW adam({{.params = {p}, .lr = 0.01}});
  autograd::set_grad(p, ops::to(from_vector<float>({0.25f, -0.5f}), kBFloat16));
  adam.step();
  EXPECT_EQ(adam.state(0, 0).exp_avg.dtype(), kFloat32);
  EXPECT_EQ(p.dtype(), kBFloat16);
  std::vector<float> got = p.to_vector<float>();
  // Worked by hand, not with loom's own rounding: in [1, 2) bf16 steps by
  // 2^-7, and 1.49 lies between 190 * 2^-7 = 1.484375 and 191 * 2^-7 = 1.4921875,
  // nearer the latter. In [0.5, 1) the step is 2^-8, and 0.74 lies between
  // 189 * 2^-8 = 0.73828125 and 190 * 2^-8 = 0.7421875, nearer the former.
  // (Rounding toward zero instead would give 1.484375.)
  EXPECT_EQ(got[0], 1.4921875f);
  EXPECT_EQ(got[1], -0.73828125f);
}

// A param large enough for the update to be split over the math threads
// (optim/adamw.cpp: one thread below 32k elements): 1 and 2 threads must give
// the same bits, and every element the scalar kernel's value - a chunk edge
// off by one would leave an element un-stepped or step it twice, 1e-2 (lr)
// away. To rounding, not to the bit: the library is compiled for the native
// CPU and may fuse a multiply and an add that this file's copy of the kernel
// rounds twice.
TEST(AdamW, SplitOverThreadsIsBitIdenticalToTheScalarKernel) {
  const int64_t n = 100003;  // not a multiple of 16: the last chunk is ragged
  Generator gen(11);
  const Tensor p0 = randn({n}, gen), g = randn({n}, gen);
  auto three_steps = [&](int threads) {
    ops::set_num_threads(threads);
    Tensor p = ops::clone(p0);
    autograd::set_requires_grad(p);
    AdamW adam({{.params = {p}, .lr = 0.01, .weight_decay = 0.1}});
    for (int t = 0; t < 3; ++t) {
      autograd::set_grad(p, g);
      adam.step();
    }
    return p.to_vector<float>();
  };
  const int before = ops::get_num_threads();
  const std::vector<float> one = three_steps(1), two = three_steps(2);
  ops::set_num_threads(before);
  std::vector<float> x = p0.to_vector<float>(), gv = g.to_vector<float>(), m(n, 0.f), v(n, 0.f);
  for (int step = 1; step <= 3; ++step) {
    const auto s = kernels::adamw_scalars<float>(0.01, 0.9, 0.999, 1e-8, 0.1, step);
    for (int64_t i = 0; i < n; ++i) kernels::adamw_update(x[i], m[i], v[i], gv[i], s);
  }
  EXPECT_EQ(one, two) << "1 vs 2 threads";
  for (int64_t i = 0; i < n; ++i)
    ASSERT_NEAR(one[size_t(i)], x[size_t(i)], 1e-6 * (1 + std::fabs(x[size_t(i)]))) << "element " << i;
}

TEST(AdamW, GradSourceReplacesTheAutogradGradient) {
  // The data-parallel wrappers feed main_grad buffers instead of autograd::grad.
  Tensor p = param(kP0);
  std::vector<double> g1 = grad_at(1);
  Tensor main_grad = from_vector<float>(std::vector<float>(g1.begin(), g1.end()));
  AdamW adam({{.params = {p}, .lr = 0.01}});
  adam.set_grad_source([&](const Tensor& q) { return q.is_same(p) ? main_grad : Tensor(); });
  adam.step();  // p has no autograd grad at all
  RefAdamW ref{.lr = 0.01, .p = kP0};
  ref.step(grad_at(1));
  expect_near(p, ref.p, 1e-6, "grad source");
}

TEST(Optimizer, ZeroGradDropsOrZeroesGradients) {
  Tensor p = param({1, 2});
  SGD sgd({{.params = {p}, .lr = 0.1}});
  set_grad(p, {3, 4});
  sgd.zero_grad(false);
  EXPECT_EQ(autograd::grad(p).to_vector<float>(), (std::vector<float>{0, 0}));
  sgd.zero_grad();
  EXPECT_FALSE(autograd::grad(p).defined());
}

TEST(Optimizer, SameParamInTwoGroupsIsAnError) {
  Tensor p = param({1});
  EXPECT_THROW(AdamW({{.params = {p}}, {.params = {p}}}), Error);
}

// ---- state dict ------------------------------------------------------------------

namespace {
// Three params of different shapes with deterministic, step-dependent grads.
std::vector<Tensor> make_params() {
  return {param({0.5, -1, 2, 0.25, 3, -0.5}), param({1, -2}), param({0.125})};
}
void feed_grads(const std::vector<Tensor>& ps, int t) {
  for (size_t k = 0; k < ps.size(); ++k) {
    std::vector<double> g(size_t(ps[k].numel()));
    for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(double(t * 7 + int(k) * 3 + int(i)));
    set_grad(ps[k], g);
  }
}
std::vector<ParamGroup> groups_of(const std::vector<Tensor>& ps) {
  return {{.params = {ps[0]}, .lr = 0.01, .weight_decay = 0.1, .name = "decay"},
          {.params = {ps[1], ps[2]}, .lr = 0.02, .weight_decay = 0.0, .name = "no_decay"}};
}
NamedTensors clone_all(const NamedTensors& sd) {
  NamedTensors out;
  for (const auto& [n, t] : sd) out.emplace_back(n, ops::clone(t));
  return out;
}

// Resume is bit-identical: 5 steps straight equal 3 steps, the state dict
// saved, a new optimizer (from make) that loads it, and 2 more steps. Expects
// the params bit for bit equal; returns the state dicts for optimizer-specific checks.
struct ResumeRun {
  NamedTensors saved, straight_state, resumed_state;
};
template <class Optimizer>
ResumeRun expect_resume_is_bit_identical(
    const std::function<std::unique_ptr<Optimizer>(const std::vector<Tensor>&)>& make) {
  std::vector<Tensor> straight = make_params(), resumed = make_params();
  std::unique_ptr<Optimizer> a = make(straight);
  for (int t = 1; t <= 5; ++t) {
    feed_grads(straight, t);
    a->step();
  }
  NamedTensors saved;
  {
    std::unique_ptr<Optimizer> b = make(resumed);
    for (int t = 1; t <= 3; ++t) {
      feed_grads(resumed, t);
      b->step();
    }
    saved = clone_all(b->state_dict());
  }
  std::unique_ptr<Optimizer> c = make(resumed);
  c->load_state_dict(saved);
  for (int t = 4; t <= 5; ++t) {
    feed_grads(resumed, t);
    c->step();
  }
  for (size_t k = 0; k < straight.size(); ++k)
    EXPECT_EQ(straight[k].to_vector<float>(), resumed[k].to_vector<float>()) << "param " << k;
  return {saved, a->state_dict(), c->state_dict()};
}
}  // namespace

TEST(StateDict, AdamWEntriesAreNamedByGroupAndParamIndex) {
  std::vector<Tensor> ps = make_params();
  AdamW adam(groups_of(ps));
  NamedTensors sd = adam.state_dict();
  std::vector<std::string> names;
  for (const auto& e : sd) names.push_back(e.first);
  EXPECT_EQ(names, (std::vector<std::string>{"state.0.0.step", "state.0.0.exp_avg", "state.0.0.exp_avg_sq",
                                             "state.1.0.step", "state.1.0.exp_avg", "state.1.0.exp_avg_sq",
                                             "state.1.1.step", "state.1.1.exp_avg", "state.1.1.exp_avg_sq"}));
  EXPECT_EQ(sd[0].second.dtype(), kInt64);
  EXPECT_EQ(sd[0].second.shape(), Shape{});
  EXPECT_EQ(sd[4].second.shape(), Shape{2});
  EXPECT_EQ(sd[4].second.dtype(), kFloat32);
}

TEST(StateDict, AdamWResumeIsBitIdentical) {
  ResumeRun r = expect_resume_is_bit_identical<AdamW>(
      [](const std::vector<Tensor>& ps) { return std::make_unique<AdamW>(groups_of(ps)); });
  ASSERT_EQ(r.resumed_state.size(), r.straight_state.size());
  for (size_t k = 0; k < r.straight_state.size(); ++k)
    EXPECT_EQ(r.straight_state[k].second.to_vector<double>(), r.resumed_state[k].second.to_vector<double>())
        << r.straight_state[k].first;
}

TEST(StateDict, SGDMomentumResumeIsBitIdentical) {
  ResumeRun r = expect_resume_is_bit_identical<SGD>([](const std::vector<Tensor>& ps) {
    return std::make_unique<SGD>(groups_of(ps), SGDOptions{.momentum = 0.9, .nesterov = true});
  });
  EXPECT_EQ(r.saved[0].first, "state.0.0.momentum_buffer");
}

namespace {
// The message of the loom::Error that f throws ("" if none).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(StateDict, LoadErrorsNameTheEntryAndShapes) {
  std::vector<Tensor> ps = make_params();
  AdamW adam(groups_of(ps));
  feed_grads(ps, 1);
  adam.step();
  NamedTensors good = clone_all(adam.state_dict());

  NamedTensors missing = good;
  missing.erase(missing.begin() + 4);  // state.1.0.exp_avg
  EXPECT_EQ(error_of([&] { adam.load_state_dict(missing); }),
            "load_state_dict: missing entry state.1.0.exp_avg (expected [2] float32)");

  NamedTensors wrong_shape = good;
  wrong_shape[1].second = zeros({3, 2});
  EXPECT_EQ(error_of([&] { adam.load_state_dict(wrong_shape); }),
            "load_state_dict: entry state.0.0.exp_avg has shape [3, 2], expected [6]");

  NamedTensors wrong_dtype = good;
  wrong_dtype[0].second = zeros({}, kFloat32);
  EXPECT_EQ(error_of([&] { adam.load_state_dict(wrong_dtype); }),
            "load_state_dict: entry state.0.0.step has dtype float32, expected int64");

  NamedTensors extra = good;
  extra.emplace_back("state.2.0.exp_avg", zeros({4}));
  EXPECT_EQ(error_of([&] { adam.load_state_dict(extra); }),
            "load_state_dict: unexpected entry state.2.0.exp_avg [4] float32 (this optimizer has 2 param groups "
            "and 9 state entries)");

  NamedTensors twice = good;
  twice.push_back(good[0]);
  EXPECT_EQ(error_of([&] { adam.load_state_dict(twice); }), "load_state_dict: entry state.0.0.step appears twice");

  // A failed load changes nothing: the state is still the one after step 1.
  NamedTensors bad = good;
  for (auto& e : bad) e.second = zeros_like(e.second);
  bad.pop_back();
  EXPECT_THROW(adam.load_state_dict(bad), Error);
  NamedTensors now = adam.state_dict();
  for (size_t k = 0; k < now.size(); ++k)
    EXPECT_EQ(now[k].second.to_vector<double>(), good[k].second.to_vector<double>()) << now[k].first;
}

// ---- gradient clipping ----------------------------------------------------------

TEST(ClipGradNorm, ThreeFourFiveScalesToMaxNorm) {
  Tensor p = param({0, 0});
  set_grad(p, {3, 4});
  double norm = optim::clip_grad_norm({p}, 1.0);
  EXPECT_DOUBLE_EQ(norm, 5.0);
  // Scaled by max_norm / (norm + 1e-6).
  expect_near(autograd::grad(p), {3 / (5 + 1e-6), 4 / (5 + 1e-6)}, 1e-7, "clipped grad");
}

TEST(ClipGradNorm, NormAcrossTensorsAndSkipsParamsWithoutGrad) {
  Tensor a = param({0}), b = param({0, 0}), c = param({0});
  set_grad(a, {3});
  set_grad(b, {4, 12});  // sqrt(9 + 16 + 144) = 13
  double norm = optim::clip_grad_norm({a, b, c, a}, 26.0);  // a listed twice (tied): counted once
  EXPECT_DOUBLE_EQ(norm, 13.0);
  // Below max_norm: untouched, bit for bit.
  EXPECT_EQ(autograd::grad(a).to_vector<float>(), (std::vector<float>{3}));
  EXPECT_EQ(autograd::grad(b).to_vector<float>(), (std::vector<float>{4, 12}));
  EXPECT_FALSE(autograd::grad(c).defined());
  norm = optim::clip_grad_norm({a, b, c}, 6.5);
  EXPECT_DOUBLE_EQ(norm, 13.0);
  double s = 6.5 / (13 + 1e-6);
  expect_near(autograd::grad(a), {3 * s}, 1e-7, "a");
  expect_near(autograd::grad(b), {4 * s, 12 * s}, 1e-7, "b");
  EXPECT_NEAR(optim::global_grad_norm({autograd::grad(a), autograd::grad(b)}, nullptr), 6.5, 1e-6);
}

TEST(ClipGradNorm, ExplicitGradsAndBadMaxNorm) {
  Tensor g = from_vector<float>({6, 8});
  EXPECT_DOUBLE_EQ(optim::global_grad_norm({g}, nullptr), 10.0);
  optim::scale_grads_to_norm({g}, 5.0, 10.0);
  expect_near(g, {6 * 5 / (10 + 1e-6), 8 * 5 / (10 + 1e-6)}, 1e-6, "main_grad");
  Tensor p = param({0});
  set_grad(p, {1});
  EXPECT_THROW(optim::clip_grad_norm({p}, 0.0), Error);
  EXPECT_DOUBLE_EQ(optim::global_grad_norm({}, nullptr), 0.0);
}

// ---- LR schedule ----------------------------------------------------------------

TEST(LrSchedule, WarmupThenCosineToMinLr) {
  const double max_lr = 1e-3, min_lr = 1e-4;
  auto lr = [&](int64_t step) { return optim::lr_at(step, max_lr, 10, 110, min_lr); };
  EXPECT_DOUBLE_EQ(lr(0), 1e-4);    // warmup start: max_lr * 1 / 10
  EXPECT_DOUBLE_EQ(lr(4), 5e-4);    // max_lr * 5 / 10
  EXPECT_DOUBLE_EQ(lr(9), 1e-3);    // warmup end
  EXPECT_DOUBLE_EQ(lr(10), 1e-3);   // cosine start
  EXPECT_NEAR(lr(35), min_lr + 0.5 * (1 + std::cos(std::numbers::pi / 4)) * 9e-4, 1e-15);  // a quarter in
  EXPECT_NEAR(lr(60), 5.5e-4, 1e-15);  // halfway: the mean of max and min
  EXPECT_NEAR(lr(109), min_lr + 0.5 * (1 + std::cos(std::numbers::pi * 99 / 100)) * 9e-4, 1e-15);
  EXPECT_DOUBLE_EQ(lr(110), min_lr);  // end
  EXPECT_DOUBLE_EQ(lr(1000), min_lr);
  EXPECT_DOUBLE_EQ(optim::lr_at(0, 1e-3, 0, 100, 0.0), 1e-3);  // no warmup
}

TEST(LrSchedule, InvalidArgumentsAreErrors) {
  EXPECT_THROW(optim::lr_at(-1, 1e-3, 10, 100, 0.0), Error);
  EXPECT_THROW(optim::lr_at(0, 1e-3, -1, 100, 0.0), Error);
  EXPECT_THROW(optim::lr_at(0, 1e-3, 101, 100, 0.0), Error);
  EXPECT_THROW(optim::lr_at(0, 1e-3, 0, 0, 0.0), Error);
  EXPECT_THROW(optim::lr_at(0, 1e-3, 10, 100, 2e-3), Error);  // min_lr > max_lr
  EXPECT_EQ(error_of([] { optim::lr_at(0, 1e-3, 200, 100, 0.0); }),
            "lr_at: warmup must be in [0, total_steps = 100], got 200");
}
