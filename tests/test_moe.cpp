// The mixture-of-experts layer, one step at a time (nn/moe*.h): the router's
// top-k and renormalised weights, the routing map with and without capacity,
// permute/unpermute, the expert compute, the aux losses and the bias update;
// every backward gradient-checked (tests/gradcheck.h), the whole layer
// against a token-by-token loop written from Mixtral's definition.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "gradcheck.h"
#include "nn/moe.h"
#include "nn/moe_aux_loss.h"
#include "nn/moe_router.h"
#include "nn/moe_token_dispatcher.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

using namespace loom;
using loom::test::gradcheck;
using loom::test::leaf;
using loom::test::rand64;
using loom::test::randn64;
using X = const autograd::TensorList&;

namespace {

std::vector<int64_t> ints(const Tensor& t) { return ops::contiguous(t).to_vector<int64_t>(); }

// chosen experts [N, K] int64 from their values, row by row
Tensor chosen_of(std::initializer_list<int64_t> values, int64_t K) {
  const std::vector<int64_t> v(values);
  return from_vector(v, {int64_t(v.size()) / K, K});
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = ops::to(a, kFloat64).to_vector<double>(), y = ops::to(b, kFloat64).to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

// A float64 MoE layer: C 6, I 5, E 4 experts, k 2.
std::shared_ptr<nn::MoE> moe64(nn::MoEOptions o, uint64_t seed = 7) {
  Generator gen(seed);
  auto m = std::make_shared<nn::MoE>(6, 5, o, gen, 0.2);
  m->to(kFloat64);
  NoGradGuard no_grad;
  for (auto& [name, p] : m->named_parameters()) {  // weights of order 1, so every path carries gradient
    Generator g(seed + std::hash<std::string>{}(name));
    ops::copy_(p, randn(p.shape(), g, kFloat64, 0.0, 0.5));
  }
  return m;
}

nn::MoEOptions options(int64_t E, int64_t K) {
  nn::MoEOptions o;
  o.experts = E, o.experts_per_token = K;
  return o;
}

}  // namespace

TEST(MoERoutingMap, GroupsSlotsByExpertAsTheHeaderWorkedExample) {
  const nn::RoutingMap map = nn::make_routing_map(chosen_of({2, 0, 0, 1, 2, 1}, 2), 3);
  EXPECT_EQ(map.tokens_per_expert, (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(ints(map.permuted_token), (std::vector<int64_t>{0, 1, 1, 2, 0, 2}));
  EXPECT_EQ(ints(map.slot_row), (std::vector<int64_t>{4, 0, 1, 2, 5, 3}));
  EXPECT_EQ(map.dropped, 0);
}

TEST(MoERoutingMap, CapacityDropsTheLaterTokensOfAFullExpert) {
  // 4 tokens, k 1, all but the last to expert 1: capacity ceil(1.0 * 4 * 1 / 2) = 2 keeps tokens 0 and 1.
  EXPECT_EQ(nn::expert_capacity(1.0, 4, 1, 2), 2);
  EXPECT_EQ(nn::expert_capacity(1.25, 10, 2, 8), 4);  // ceil(3.125)
  const Tensor chosen = chosen_of({1, 1, 1, 0}, 1);
  const nn::RoutingMap map = nn::make_routing_map(chosen, 2, 2);
  EXPECT_EQ(map.dropped, 1);
  EXPECT_EQ(map.tokens_per_expert, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(ints(map.permuted_token), (std::vector<int64_t>{3, 0, 1}));
  EXPECT_EQ(ints(map.slot_row), (std::vector<int64_t>{1, 2, 3, 0}));  // token 2's slot points at the zero row M = 3
}

TEST(MoERouter, TopKIsByDescendingScoreAndTheBiasChangesOnlyTheChoice) {
  const Tensor scores = tensor({0.1, 0.5, 0.3, 0.1, 0.6, 0.2, 0.1, 0.1}, {2, 4});
  EXPECT_EQ(ints(nn::top_k_experts(scores, 2)), (std::vector<int64_t>{1, 2, 0, 1}));
  // ties go to the lower index: experts 0 and 3 tie at 0.1 in row 0, experts 2 and 3 in row 1
  EXPECT_EQ(ints(nn::top_k_experts(scores, 3)), (std::vector<int64_t>{1, 2, 0, 0, 1, 2}));
  EXPECT_EQ(ints(nn::top_k_experts(scores, 2, tensor({0.0, 0.0, 0.0, 1.0}))), (std::vector<int64_t>{3, 1, 3, 0}));

  Tensor x = randn64({5, 6}, 1), gate = randn64({4, 6}, 2);
  const nn::RouterOutput plain = nn::route_top_k(x, gate, 2);
  const nn::RouterOutput biased = nn::route_top_k(x, gate, 2, tensor({5.0, 0.0, 0.0, 5.0}));
  // The bias picks experts 0 and 3 for every token; the weights are their unbiased probabilities, renormalised.
  const std::vector<int64_t> c = ints(biased.chosen);
  const std::vector<double> p = biased.probs.to_vector<double>(), w = biased.weights.to_vector<double>();
  for (int64_t n = 0; n < 5; ++n) {
    const int64_t a = c[size_t(2 * n)], b = c[size_t(2 * n + 1)];
    EXPECT_TRUE((a == 0 && b == 3) || (a == 3 && b == 0)) << a << ", " << b;
    const double pa = p[size_t(n * 4 + a)], pb = p[size_t(n * 4 + b)];
    EXPECT_GE(pa + 5.0, pb + 5.0);  // by descending biased score
    EXPECT_NEAR(w[size_t(2 * n)], pa / (pa + pb), 1e-12);
    EXPECT_NEAR(w[size_t(2 * n + 1)], pb / (pa + pb), 1e-12);
  }
  EXPECT_NEAR(ops::sum(plain.weights).item<double>(), 5.0, 1e-12);  // each row sums to 1
}

TEST(MoERouter, RenormalisedTopKWeightsGradientChecked) {
  Tensor x = leaf(randn64({7, 6}, 3)), gate = leaf(randn64({5, 6}, 4));
  for (int64_t k : {1, 2, 3, 5}) {
    SCOPED_TRACE(k);
    EXPECT_TRUE(gradcheck([k](X v) { return nn::route_top_k(v[0], v[1], k).weights; }, {x, gate}));
  }
  EXPECT_TRUE(gradcheck([](X v) { return nn::route_top_k(v[0], v[1], 2, tensor({0, 1, 0, 0, 2})).weights; },
                        {x, gate}));
}

TEST(MoETokenDispatcher, PermuteAndUnpermuteGradientChecked) {
  const nn::RoutingMap map = nn::make_routing_map(chosen_of({2, 0, 0, 1, 2, 1}, 2), 3);
  const nn::RoutingMap dropping = nn::make_routing_map(chosen_of({2, 0, 0, 2, 2, 1}, 2), 3, 1);
  ASSERT_EQ(dropping.dropped, 3);  // slots 2, 3 and 4: experts 0 and 2 were full
  EXPECT_TRUE(gradcheck([&](X v) { return nn::permute(v[0], map); }, {leaf(randn64({3, 4}, 5))}));
  EXPECT_TRUE(gradcheck([&](X v) { return nn::unpermute(v[0], v[1], map); },
                        {leaf(randn64({6, 4}, 6)), leaf(randn64({3, 2}, 7))}));
  EXPECT_TRUE(gradcheck([&](X v) { return nn::unpermute(v[0], v[1], dropping); },
                        {leaf(randn64({3, 4}, 8)), leaf(randn64({3, 2}, 9))}));
  // unpermute is the weighted sum of each token's rows: token 1 = w[1,0] y[1] + w[1,1] y[2]
  const Tensor y = randn64({6, 4}, 10), w = randn64({3, 2}, 11);
  const Tensor out = nn::unpermute(y, w, map);
  const Tensor want = ops::add(ops::mul(ops::narrow(y, 0, 1, 1), w.to_vector<double>()[2]),
                               ops::mul(ops::narrow(y, 0, 2, 1), w.to_vector<double>()[3]));
  EXPECT_LE(max_abs_diff(ops::narrow(out, 0, 1, 1), want), 1e-12);
}

TEST(MoEAuxLoss, LoadBalancingIsEOfFTimesPAndItsGradientChecked) {
  // 2 tokens, 2 experts, k 1: both to expert 0, so f = [1, 0]; P = mean probs.
  const Tensor probs = tensor({0.7, 0.3, 0.6, 0.4}, {2, 2}, kFloat64);
  EXPECT_NEAR(nn::load_balancing_loss(probs, chosen_of({0, 0}, 1)).item<double>(), 2 * 0.65, 1e-12);
  // a uniform router and load: the minimum, K
  const Tensor uniform = full({4, 4}, 0.25, kFloat64);
  EXPECT_NEAR(nn::load_balancing_loss(uniform, chosen_of({0, 1, 2, 3, 1, 0, 3, 2}, 2)).item<double>(), 2.0, 1e-12);
  // through the softmax of a router: d/d logits
  const Tensor chosen = chosen_of({0, 2, 1, 2, 3, 0}, 2);
  EXPECT_TRUE(gradcheck([&](X v) { return nn::load_balancing_loss(autograd::softmax(v[0]), chosen); },
                        {leaf(randn64({3, 4}, 12))}));
  EXPECT_TRUE(gradcheck([](X v) { return nn::router_z_loss(v[0]); }, {leaf(randn64({3, 4}, 13))}));
  const Tensor l = tensor({1, 2, 3, 0, 0, 0}, {2, 3}, kFloat64);
  const double lse0 = std::log(std::exp(1) + std::exp(2) + std::exp(3)), lse1 = std::log(3.0);
  EXPECT_NEAR(nn::router_z_loss(l).item<double>(), (lse0 * lse0 + lse1 * lse1) / 2, 1e-12);
}

TEST(MoEAuxLoss, AttachedLossAddsCoefTimesScaleTimesItsGradient) {
  // d/dw of sum(out * r) + coef * scale * aux, with out = attach(x * w, aux(w)), aux = sum(w^2)
  const Tensor r = randn64({3}, 14);
  auto grad_of_w = [&](double coef, double loss_scale, int64_t micro_batches) {
    nn::set_aux_loss_backward_scale(loss_scale, micro_batches);
    Tensor w = leaf(randn64({3}, 15));
    Tensor aux = autograd::sum(autograd::mul(w, w));
    Tensor out = nn::attach_aux_loss(autograd::mul(w, 2.0), aux, coef);
    autograd::backward(autograd::sum(autograd::mul(out, r)));
    return autograd::grad(w);
  };
  const Tensor w = randn64({3}, 15);
  const Tensor plain = grad_of_w(0.0, 1.0, 1);
  EXPECT_LE(max_abs_diff(plain, ops::mul(r, 2.0)), 1e-12);
  // coef 0.5, loss scale 8, 4 micro-batches: + 0.5 * 2 * 2w
  EXPECT_LE(max_abs_diff(grad_of_w(0.5, 8.0, 4), ops::add(ops::mul(r, 2.0), ops::mul(w, 0.5 * 2 * 2))), 1e-12);
  nn::set_aux_loss_backward_scale(1.0, 1);
}

TEST(MoELayer, EqualsMixtralsTokenByTokenDefinition) {
  for (int64_t shared : {0, 1}) {
    nn::MoEOptions o = options(4, 2);
    o.shared_experts = shared;
    auto m = moe64(o);
    const Tensor x = randn64({2, 3, 6}, 16);
    const Tensor out = m->forward(x);
    // out[n] = Σ over the k chosen e of softmax(gate x)[e] / Σ_chosen * expert_e(x[n]) (+ shared(x[n]))
    const Tensor tokens = ops::reshape(x, {6, 6});
    const Tensor probs = ops::softmax(ops::linear(tokens, m->gate->weight, Tensor()));
    const std::vector<double> p = probs.to_vector<double>();
    for (int64_t n = 0; n < 6; ++n) {
      const Tensor xn = ops::narrow(tokens, 0, n, 1);
      std::vector<std::pair<double, int64_t>> ranked;
      for (int64_t e = 0; e < 4; ++e) ranked.push_back({-p[size_t(n * 4 + e)], e});
      std::sort(ranked.begin(), ranked.end());
      const double norm = -ranked[0].first - ranked[1].first;
      Tensor want = zeros({1, 6}, kFloat64);
      for (int k = 0; k < 2; ++k)
        want = ops::add(want, ops::mul((*m->experts)[size_t(ranked[size_t(k)].second)]->forward(xn),
                                       -ranked[size_t(k)].first / norm));
      if (shared) want = ops::add(want, m->shared_experts->forward(xn));
      EXPECT_LE(max_abs_diff(ops::narrow(ops::reshape(out, {6, 6}), 0, n, 1), want), 1e-12) << "token " << n;
    }
  }
}

TEST(MoELayer, WholeLayerGradientChecked) {
  // Dropless with shared experts, and with a capacity that drops a quarter of the slots.
  nn::MoEOptions shared = options(4, 2), dropping = options(4, 2);
  shared.shared_experts = 1;
  dropping.capacity_factor = 0.5;
  for (const nn::MoEOptions& opt : {shared, dropping}) {
    SCOPED_TRACE(opt.capacity_factor);
    auto m = moe64(opt);
    autograd::TensorList inputs{leaf(randn64({2, 4, 6}, 17))};
    for (auto& [name, p] : m->named_parameters()) inputs.push_back(p);
    EXPECT_TRUE(gradcheck([&](X v) { return m->forward(v[0]); }, inputs, {1e-6, 1e-5, 1e-5}));
  }
}

TEST(MoELayer, AttachedAuxLossesAddCoefTimesTheirGradient) {
  // The layer's gradient with the aux and z losses attached = without + coef_aux d aux + coef_z d z,
  // each term's own backward being gradient-checked above.
  nn::MoEOptions o = options(4, 2), plain = options(4, 2);
  o.aux_loss_coef = 0.3, o.z_loss_coef = 0.2;
  auto with = moe64(o), without = moe64(plain);
  const Tensor x = randn64({2, 4, 6}, 17), r = randn64({2, 4, 6}, 18);
  nn::set_aux_loss_backward_scale(1.0, 1);
  autograd::backward(autograd::sum(autograd::mul(with->forward(x), r)));
  autograd::backward(autograd::sum(autograd::mul(without->forward(x), r)));
  const nn::RouterOutput route = nn::route_top_k(ops::reshape(x, {8, 6}), without->gate->weight, 2);
  autograd::backward(autograd::add(autograd::mul(nn::load_balancing_loss(route.probs, route.chosen), 0.3),
                                   autograd::mul(nn::router_z_loss(route.logits), 0.2)));
  const Tensor g_with = autograd::grad(with->gate->weight), g_sum = autograd::grad(without->gate->weight);
  EXPECT_GT(max_abs_diff(g_with, zeros_like(g_with)), 1e-3);
  EXPECT_LE(max_abs_diff(g_with, g_sum), 1e-12);
}

TEST(MoELayer, AnExpertWithNoTokenGetsAZeroGradient) {
  auto m = moe64(options(4, 1));
  {
    NoGradGuard no_grad;
    ops::fill_(m->gate->weight, 0.0);
    ops::fill_(ops::narrow(m->gate->weight, 0, 2, 1), 1.0);  // a large positive score for expert 2 ...
  }
  const Tensor x = rand64({1, 5, 6}, 18, 0.1, 1.0);          // ... on positive tokens: all go to expert 2
  autograd::backward(autograd::sum(m->forward(x)));
  for (int64_t e = 0; e < 4; ++e) {
    const Tensor g = autograd::grad((*m->experts)[size_t(e)]->w1->weight);
    ASSERT_TRUE(g.defined()) << "expert " << e;
    EXPECT_EQ(max_abs_diff(g, zeros_like(g)) == 0.0, e != 2) << "expert " << e;
  }
}

TEST(MoELayer, BiasMovesTowardTheMeanLoadBySignAfterEachStep) {
  nn::MoEOptions o = options(4, 1);
  o.bias_update_rate = 0.01;
  auto m = moe64(o);
  m->step_load = {5, 1, 2, 0};  // mean 2: experts 1 and 3 up, 0 down, 2 unchanged
  nn::update_router_bias(*m);
  EXPECT_EQ(m->score_bias.to_vector<float>(), (std::vector<float>{-0.01f, 0.01f, 0.0f, 0.01f}));
  EXPECT_EQ(m->step_load, (std::vector<int64_t>{0, 0, 0, 0}));
  // and a forward in training counts the loads the next update reads
  m->forward(randn64({1, 3, 6}, 19));
  int64_t total = 0;
  for (int64_t l : m->step_load) total += l;
  EXPECT_EQ(total, 3);
}

// A micro-batch split over two ranks along T (sequence parallelism: their gradients are summed), played
// in one process: each half's layer sums its per-expert counts with the other half's (nn::TokenShards),
// and the halves' gradients add up to the whole layer's, the aux and z losses and the bias's load included.
TEST(MoELayer, TokenShardsSummedOverTheHalvesGiveTheWholeMicroBatchsGradient) {
  nn::MoEOptions o = options(4, 2);
  o.aux_loss_coef = 0.3, o.z_loss_coef = 0.2, o.bias_update_rate = 0.1;
  const Tensor x = randn64({2, 4, 6}, 21), r = randn64({2, 4, 6}, 22);
  auto half = [](const Tensor& t, int64_t i) { return ops::contiguous(ops::narrow(t, 1, 2 * i, 2)); };
  auto whole = moe64(o);
  nn::set_aux_loss_backward_scale(1.0, 1);
  autograd::backward(autograd::sum(autograd::mul(whole->forward(x), r)));
  // Each half's own counts, as the other rank would contribute them.
  std::vector<double> local[2];
  for (int i = 0; i < 2; ++i) {
    auto probe = moe64(o);
    probe->token_shards.sum = [&local, i](std::vector<double>& v) { local[i] = v; };
    probe->forward(half(x, i));
  }
  std::shared_ptr<nn::MoE> halves[2] = {moe64(o), moe64(o)};
  Tensor x_half[2];
  for (int i = 0; i < 2; ++i) {
    const std::vector<double> other = local[1 - i];
    halves[i]->token_shards = {[other](std::vector<double>& v) {
                                 for (size_t j = 0; j < v.size(); ++j) v[j] += other[j];
                               },
                               /*summed_ranks=*/2};
    x_half[i] = leaf(half(x, i));
    autograd::backward(autograd::sum(autograd::mul(halves[i]->forward(x_half[i]), half(r, i))));
  }
  for (const auto& [name, p] : whole->named_parameters()) {
    Tensor sum = zeros_like(p);
    for (int i = 0; i < 2; ++i)
      for (const auto& [n, q] : halves[i]->named_parameters())
        if (n == name) sum = ops::add(sum, autograd::grad(q));
    EXPECT_LE(max_abs_diff(sum, autograd::grad(p)), 1e-12) << name;
  }
  EXPECT_EQ(halves[0]->step_load, whole->step_load);  // the bias moves by the micro-batch's load on both
  EXPECT_EQ(halves[1]->step_load, whole->step_load);
  EXPECT_NEAR(halves[0]->stats.aux_loss, whole->stats.aux_loss, 1e-12);
}
