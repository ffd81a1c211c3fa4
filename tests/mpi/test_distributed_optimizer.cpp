// The distributed optimizer (ZeRO-1) against the unsharded one, run by CTest on
// 2, 3 and 4 ranks (dp = world). Both sides train the same toy model on the
// same per-rank data: the reference with DataParallelBucket (AllReduce) and
// MixedPrecisionOptimizer, ZeRO with DataParallelBucket (ReduceScatter) and
// DistributedOptimizer. Also: the reduce-scattered gradient against its closed
// form, the per-rank memory through the allocator, and a found_inf on one rank
// skipping the step on all of them.
//
// The toy model: leaf params of odd sizes [7], [130], [5, 33], [3, 50] (452
// elements: not a multiple of 3; with small buckets of 150, 165 and 137,
// two are not multiples of 2 or 4 either - train_zero asserts it - so buckets
// are padded and shards cut through params). Rank r's loss at step s is
//   L_r = sum_i sum(0.5 * a_{r,s,i} * p_i * p_i + b_{r,s,i} * p_i)
// so dL_r/dp_i = a_{r,s,i} * p_i + b_{r,s,i}, and the dp-averaged gradient is
// mean_r(a_r) * p + mean_r(b_r).
//
// Bitwise or not: without clipping the update of an element depends only on
// its own averaged gradient, the sum over ranks of their gradients divided by
// dp. With dp = 2 that sum is a + b on both sides (addition commutes, the
// division by 2 is exact), so ZeRO and the unsharded run agree bit for bit and
// the tests assert it. With more ranks MPI_Allreduce and MPI_Reduce_scatter_block
// may add the ranks' values in different orders (Open MPI here: bitwise at
// dp = 3, last-bit differences of ~5e-8 relative at dp = 4 in fp32), so those
// are compared within 1e-6 relative (max |a - b| / max |b| per tensor). With
// clipping, the global norm is a sum of squares taken in a different order
// (each rank sums its shard, then the ranks' partial sums are added), so the
// clip factor may differ in its last bit too: within 1e-6 at every dp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <unordered_map>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "optim/distributed_optimizer.h"
#include "optim/mixed_precision_optimizer.h"
#include "parallel/data_parallel/zero_data_parallel_bucket.h"
#include "parallel/comm/distributed.h"
#include "tensor/grad_mode.h"
#include "tensor/storage.h"

using namespace loom;
using namespace loom::autograd;
using loom::optim::DistributedOptimizer;
using loom::optim::MainParam;
using loom::optim::MixedPrecisionOptimizer;
using loom::optim::MixedPrecisionOptions;
using loom::optim::ParamGroup;
using loom::optim::StepResult;
using loom::parallel::BucketOptions;
using loom::parallel::DataParallelBucket;
using loom::parallel::GradReduce;
using loom::parallel::ProcessGroup;
using loom::parallel::ZeroDataParallelBucket;

namespace {

constexpr int kSteps = 5;
constexpr double kLr = 1e-2;
constexpr double kTolerance = 1e-6;
constexpr optim::AdamWOptions kAdam{0.9, 0.95, 1e-8};
const std::vector<Shape> kShapes = {{7}, {130}, {5, 33}, {3, 50}};
constexpr double kOneBucket = 25.0;                        // MB: everything in one bucket
constexpr double kSmallBuckets = 200.0 * 4 / (1 << 20);  // 200 fp32: buckets {[3,50]}, {[5,33]}, {[130], [7]}

ProcessGroup& world() { return parallel::world(); }

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

// DataParallelBucket takes named params (Module::named_parameters()): p0, p1, ...
parallel::NamedParams named(const std::vector<Tensor>& params) {
  parallel::NamedParams out;
  for (const Tensor& p : params) out.emplace_back(str("p", out.size()), p);
  return out;
}

// The toy model; the same initial values on every rank.
struct Toy {
  std::vector<Tensor> params;
  explicit Toy(DType dtype) {
    Generator g(17);
    for (const Shape& s : kShapes) {
      Tensor p = ops::to(randn(s, g, kFloat32, 0.0, 0.5), dtype);
      set_requires_grad(p);
      params.push_back(p);
    }
  }
  // Two groups, in an order different from the module order.
  std::vector<ParamGroup> groups() const {
    return {{{params[2], params[3]}, kLr, 0.1, "decay"}, {{params[0], params[1]}, kLr, 0.0, "no_decay"}};
  }
  size_t index_of(const Tensor& p) const {
    for (size_t i = 0; i < params.size(); ++i)
      if (params[i].is_same(p)) return i;
    ADD_FAILURE() << "not a toy param: " << p.describe();
    return 0;
  }
};

// Rank r's data for step s, fp32: a in [0.5, 1.5), b ~ N(0, 1), one pair per param.
struct Data {
  std::vector<Tensor> a, b;
};
Data data_of(int rank, int step) {
  Generator g(1000 + 100 * uint64_t(rank) + uint64_t(step));
  Data d;
  for (const Shape& s : kShapes) {
    d.a.push_back(rand(s, g, kFloat32, 0.5, 1.5));
    d.b.push_back(randn(s, g));
  }
  return d;
}

Tensor loss_of(const Toy& m, int rank, int step) {
  Data d = data_of(rank, step);
  Tensor loss;
  for (size_t i = 0; i < m.params.size(); ++i) {
    const Tensor& p = m.params[i];
    Tensor a = ops::to(d.a[i], p.dtype()), b = ops::to(d.b[i], p.dtype());
    Tensor term = sum(p * p * a * 0.5 + b * p);
    loss = loss.defined() ? loss + term : term;
  }
  return loss;
}

// max |got - expected| / max |expected|.
double rel_diff(const std::vector<float>& got, const std::vector<float>& expected) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff = std::max(diff, std::abs(double(got[i]) - double(expected[i])));
    scale = std::max(scale, std::abs(double(expected[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (bits(a[i]) != bits(b[i])) return false;
  return true;
}

double max_over_ranks(double x) {
  Tensor t = full({}, x, kFloat64);
  world().all_reduce(t, parallel::ReduceOp::Max);
  return t.item<double>();
}

void report(const std::string& what, double value) {
  if (world().rank() == 0) std::printf("[measured] dp=%d %s: %.6g\n", world().size(), what.c_str(), value);
}

// What a run leaves: the model params, and the fp32 main params as
// (param index, start, values of elements [start, start + size) flattened).
struct MainSlice {
  size_t param;
  int64_t start;
  std::vector<float> values;
};
struct RunResult {
  std::vector<std::vector<float>> params;
  std::vector<MainSlice> mains;
  std::vector<double> grad_norms;
};

RunResult finish(const Toy& m, const MixedPrecisionOptimizer& opt, std::vector<double> norms) {
  RunResult run;
  for (const Tensor& p : m.params) run.params.push_back(values(p));
  for (const MainParam& mp : opt.main_params())
    run.mains.push_back({m.index_of(mp.model_param), mp.start, values(mp.main)});
  run.grad_norms = std::move(norms);
  return run;
}

struct Config {
  DType dtype = kFloat32;
  double bucket_cap_mb = kOneBucket;
  double max_grad_norm = 0;
  bool stats_group_default = false;  // leave grad_stats_group unset: the optimizer's default (the dp group)
};

MixedPrecisionOptions options_of(const Config& c) {
  MixedPrecisionOptions o;
  o.adam = kAdam;
  o.max_grad_norm = c.max_grad_norm;
  return o;
}

// The reference: every rank holds every gradient (all-reduce) and every main param.
RunResult train_unsharded(const Config& c) {
  Toy m(c.dtype);
  std::vector<std::vector<float>> initial;
  for (const Tensor& p : m.params) initial.push_back(values(p));
  DataParallelBucket dp(named(m.params), world(), BucketOptions{c.bucket_cap_mb, /*grads_to_params=*/false});
  MixedPrecisionOptimizer opt(m.groups(), options_of(c), [&dp](const Tensor& p) { return dp.main_grad(p); });
  std::vector<double> norms;
  for (int s = 0; s < kSteps; ++s) {
    backward(loss_of(m, world().rank(), s));
    norms.push_back(opt.step().grad_norm);
    dp.reset();
  }
  for (size_t i = 0; i < m.params.size(); ++i)
    EXPECT_FALSE(bitwise_equal(values(m.params[i]), initial[i])) << "param " << i << " was trained";
  return finish(m, opt, norms);
}

// ZeRO-1: each rank holds the averaged gradient and the main params of its shard.
RunResult train_zero(const Config& c) {
  Toy m(c.dtype);
  ZeroDataParallelBucket dp(named(m.params), world(), GradReduce::ReduceScatter, c.bucket_cap_mb);
  MixedPrecisionOptions o = options_of(c);
  // Each rank holds 1/dp of the gradient: the norm is a sum over the world (here also the dp group).
  if (!c.stats_group_default) o.grad_stats_group = &world();
  DistributedOptimizer opt(m.groups(), dp, o);
  // Without clipping (and loss scaling) the buckets are stepped inside the backward callback.
  EXPECT_EQ(opt.steps_early(), c.max_grad_norm == 0);

  // The test must cover a shard cutting through a param: some rank owns a
  // strict sub-range of some param.
  int straddles = 0;
  for (size_t i = 0; i < opt.ranges().size(); ++i) {
    const optim::ParamRange& r = opt.ranges()[i];
    if (r.param.size() > 0 && r.param.size() < opt.main_params()[i].model_param.numel()) ++straddles;
  }
  EXPECT_GT(max_over_ranks(straddles), 0) << "no param straddles a shard boundary";
  // ... and a bucket whose params do not fill a multiple of dp elements: its padding is real.
  int uneven = 0;
  for (const parallel::Bucket& b : dp.bucket_manager().buckets()) {
    int64_t filled = 0;
    for (const Tensor& p : b.params) filled += p.numel();
    uneven += filled % world().size() != 0;
  }
  if (c.bucket_cap_mb == kSmallBuckets || world().size() == 3) {
    EXPECT_GT(uneven, 0) << "every bucket divides by dp";
  }

  std::vector<double> norms;
  for (int s = 0; s < kSteps; ++s) {
    opt.finish_param_sync();  // the params must be whole before forward reads them
    std::vector<std::vector<float>> mains_before;
    for (const MainParam& mp : opt.main_params()) mains_before.push_back(values(mp.main));
    backward(loss_of(m, world().rank(), s));
    // Early steps (the overlap): every owned main param is updated by the end
    // of backward, before step() is called; otherwise none is.
    size_t updated = 0;
    for (size_t i = 0; i < mains_before.size(); ++i)
      updated += !bitwise_equal(values(opt.main_params()[i].main), mains_before[i]);
    EXPECT_EQ(updated, opt.steps_early() ? mains_before.size() : 0) << "step " << s << ", rank " << world().rank();
    norms.push_back(opt.step().grad_norm);
    dp.reset();
  }
  opt.finish_param_sync();
  return finish(m, opt, norms);
}

// Compares a ZeRO run with the unsharded one: model params, this rank's main
// params (against the same elements of the reference's), grad norms. Returns
// the max relative difference over everything, over all ranks.
double compare(const RunResult& zero, const RunResult& ref, bool bitwise, const std::string& what) {
  double worst = 0;
  bool all_bitwise = true;
  for (size_t i = 0; i < ref.params.size(); ++i) {
    worst = std::max(worst, rel_diff(zero.params[i], ref.params[i]));
    all_bitwise &= bitwise_equal(zero.params[i], ref.params[i]);
  }
  for (const MainSlice& z : zero.mains) {
    const MainSlice* r = nullptr;
    for (const MainSlice& s : ref.mains)
      if (s.param == z.param) r = &s;
    if (!r) {
      ADD_FAILURE() << what << ": no reference main param for param " << z.param;
      continue;
    }
    std::vector<float> expected(r->values.begin() + z.start, r->values.begin() + z.start + int64_t(z.values.size()));
    worst = std::max(worst, rel_diff(z.values, expected));
    all_bitwise &= bitwise_equal(z.values, expected);
  }
  for (size_t s = 0; s < ref.grad_norms.size(); ++s)
    worst = std::max(worst, std::abs(zero.grad_norms[s] - ref.grad_norms[s]) / ref.grad_norms[s]);
  if (bitwise) {
    EXPECT_TRUE(all_bitwise) << what << ": expected bit-for-bit equality, max rel diff " << worst;
  }
  EXPECT_LE(worst, kTolerance) << what;
  double over_ranks = max_over_ranks(worst);
  report(what + " max rel diff ZeRO vs unsharded", over_ranks);
  report(what + " bitwise on all ranks", max_over_ranks(all_bitwise ? 0 : 1) == 0 ? 1 : 0);
  return over_ranks;
}

// ---- ZeRO-1 vs unsharded ----------------------------------------------------------

TEST(DistributedOptimizer, ReduceScatterGivesEachRankTheAverageOfItsShard) {
  Toy m(kFloat32);
  ZeroDataParallelBucket dp(named(m.params), world(), GradReduce::ReduceScatter, kSmallBuckets);
  DistributedOptimizer opt(m.groups(), dp, options_of({}));
  // The params before backward: without clipping, backward's callback already steps them.
  std::vector<std::vector<float>> p0;
  for (const Tensor& p : m.params) p0.push_back(values(p));
  backward(loss_of(m, world().rank(), 0));
  // The closed form, in double: mean over ranks of a_r * p + b_r.
  std::vector<Data> all;
  for (int r = 0; r < world().size(); ++r) all.push_back(data_of(r, 0));
  double worst = 0;
  for (size_t i = 0; i < opt.main_params().size(); ++i) {
    const MainParam& mp = opt.main_params()[i];
    size_t k = m.index_of(mp.model_param);
    const std::vector<float>& p = p0[k];
    std::vector<float> got = values(optim::flat_range(dp.main_grad(mp.model_param), mp.start, mp.end));
    for (int64_t e = mp.start; e < mp.end; ++e) {
      double g = 0;
      for (const Data& d : all)
        g += double(d.a[k].data<float>()[e]) * p[size_t(e)] + double(d.b[k].data<float>()[e]);
      g /= world().size();
      worst = std::max(worst, std::abs(got[size_t(e - mp.start)] - g) / std::max(1.0, std::abs(g)));
    }
  }
  EXPECT_LE(worst, 1e-6);
  report("reduce-scattered grad vs closed form, max rel diff", max_over_ranks(worst));
  opt.step();
  opt.finish_param_sync();
  dp.reset();
}

// The tied embedding's bucket must be marked all-reduce before the optimizer
// plans its steps (it steps buckets during backward when nothing global stands
// in the way): marked after, it is an error at once, not a silently early
// update of a half-summed weight.
TEST(DistributedOptimizer, MarkingAnAllReduceBucketAfterConstructionIsAnError) {
  Toy m(kFloat32);
  ZeroDataParallelBucket dp(named(m.params), world(), GradReduce::ReduceScatter, kSmallBuckets);
  DistributedOptimizer opt(m.groups(), dp, options_of({}));
  ASSERT_TRUE(opt.steps_early());
  try {
    dp.sharded_buckets().all_reduce_bucket_of(m.params[3]);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fixed by a DistributedOptimizer"), std::string::npos) << e.what();
  }
  backward(loss_of(m, world().rank(), 0));  // the optimizer's plan stands: a normal step
  opt.step();
  opt.finish_param_sync();
  dp.reset();
}

// See the header comment: a two-rank sum is the same in both collectives.
bool bitwise_without_clipping() { return world().size() == 2; }

// One case per dtype x buckets x clipping. max_grad_norm 0.5 is below every
// step's norm here (~10-20): every clipped case clips (asserted).
struct ZeroCase {
  const char* name;  // the GoogleTest suffix
  Config config;
  std::string what() const {
    return str(config.dtype == kFloat32 ? "fp32" : "bf16",
               config.bucket_cap_mb == kOneBucket ? " one bucket" : " small buckets",
               config.max_grad_norm > 0 ? ", clipped" : ", no clip",
               config.stats_group_default ? ", default stats group" : "");
  }
};

void PrintTo(const ZeroCase& c, std::ostream* os) { *os << c.what(); }  // for --gtest_list_tests

class ZeroMatchesUnsharded : public ::testing::TestWithParam<ZeroCase> {};

TEST_P(ZeroMatchesUnsharded, ParamsMainParamsAndGradNorms) {
  const Config& c = GetParam().config;
  RunResult ref = train_unsharded(c);
  if (c.max_grad_norm > 0) {
    for (double n : ref.grad_norms) EXPECT_GT(n, c.max_grad_norm) << "the test must clip";
  }
  const bool bitwise = c.max_grad_norm == 0 && bitwise_without_clipping();
  compare(train_zero(c), ref, bitwise, GetParam().what());
}

INSTANTIATE_TEST_SUITE_P(
    DistributedOptimizer, ZeroMatchesUnsharded,
    ::testing::Values(ZeroCase{"Fp32OneBucketNoClip", {kFloat32, kOneBucket, 0}},
                      ZeroCase{"Fp32SmallBucketsNoClip", {kFloat32, kSmallBuckets, 0}},
                      ZeroCase{"Fp32OneBucketClipped", {kFloat32, kOneBucket, 0.5}},
                      ZeroCase{"Fp32SmallBucketsClipped", {kFloat32, kSmallBuckets, 0.5}},
                      // Without a grad_stats_group the norm is still a sum over every shard: the
                      // optimizer reduces over its dp group (per rank, each would clip differently).
                      ZeroCase{"Fp32SmallBucketsClippedDefaultStatsGroup", {kFloat32, kSmallBuckets, 0.5, true}},
                      ZeroCase{"Bf16OneBucketNoClip", {kBFloat16, kOneBucket, 0}},
                      ZeroCase{"Bf16SmallBucketsNoClip", {kBFloat16, kSmallBuckets, 0}},
                      ZeroCase{"Bf16OneBucketClipped", {kBFloat16, kOneBucket, 0.5}},
                      ZeroCase{"Bf16SmallBucketsClipped", {kBFloat16, kSmallBuckets, 0.5}}),
    [](const ::testing::TestParamInfo<ZeroCase>& info) { return std::string(info.param.name); });

// ---- memory -----------------------------------------------------------------------

// ~1M params, 4 x [256, 1024], in 4 buckets (1.5 MB cap: one fp32 param each).
// Three live-byte deltas, each taken after the step that causes it:
//   params created              N x 2 (bf16) or N x 4 (fp32)
//   DataParallelBucket          the fp32 grad buffer, padded
//   DistributedOptimizer ctor   the padded param buffer is allocated and each
//                               param's old storage freed (the params become
//                               views into the buffer), so the params' part of
//                               this delta is param_buffer bytes - the old
//                               params' bytes; the rest is optimizer state.
// Optimizer state per rank: fp32 main params (bf16 only; an fp32 model's main
// params are the param buffer itself), exp_avg and exp_avg_sq for the N/dp
// elements this rank owns, plus one 8-byte step counter per owned range.
void check_memory(DType dtype) {
  const int dp = world().size();
  const int64_t esize = dtype == kFloat32 ? 4 : 2;
  world().barrier();
  const int64_t l0 = memory_stats().live_bytes;
  std::vector<Tensor> params;
  for (int i = 0; i < 4; ++i) {
    Tensor p = full({256, 1024}, 0.01 * (i + 1), dtype);
    set_requires_grad(p);
    params.push_back(p);
  }
  const int64_t n = 4 * 256 * 1024;
  const int64_t l1 = memory_stats().live_bytes;
  EXPECT_EQ(l1 - l0, esize * n);

  ZeroDataParallelBucket ddp(named(params), world(), GradReduce::ReduceScatter, 1.5);
  const int64_t l2 = memory_stats().live_bytes;
  const int64_t grad_buffer = int64_t(ddp.bucket_manager().buffer().nbytes());
  EXPECT_EQ(ddp.bucket_manager().buckets().size(), 4u);
  EXPECT_EQ(l2 - l1, grad_buffer);

  DistributedOptimizer opt({{{params[0], params[1]}, 1e-3, 0.1, "decay"}, {{params[2], params[3]}, 1e-3, 0.0, ""}},
                           ddp, {});
  const int64_t l3 = memory_stats().live_bytes;
  const int64_t param_buffer = int64_t(opt.param_buffer().nbytes());
  const int64_t state = (l3 - l2) - (param_buffer - esize * n);
  const double state_per_param = dtype == kFloat32 ? 8 : 12;
  const double predicted_state = state_per_param * double(n) / dp;
  EXPECT_NEAR(double(state), predicted_state, 0.01 * predicted_state) << dtype_name(dtype);

  // param buffer + grad buffer + optimizer state: (2 + 4 + 12/dp) N for bf16, (4 + 4 + 8/dp) N for fp32.
  const int64_t total = l3 - l0;
  const double predicted_total = (double(esize) + 4 + state_per_param / dp) * double(n);
  EXPECT_NEAR(double(total), predicted_total, 0.01 * predicted_total) << dtype_name(dtype);
  report(std::string(dtype_name(dtype)) + " optimizer state / (" + std::to_string(int(state_per_param)) +
             " N/dp), max over ranks",
         max_over_ranks(double(state) / predicted_state));
  report(std::string(dtype_name(dtype)) + " total / predicted total, max over ranks",
         max_over_ranks(double(total) / predicted_total));

  // A training step allocates nothing that stays.
  Tensor loss = sum(params[0] * 0.5) + sum(params[1]) + sum(params[2] * params[2]) + sum(params[3]);
  backward(loss);
  opt.step();
  opt.finish_param_sync();
  ddp.reset();
  loss = Tensor();
  EXPECT_EQ(memory_stats().live_bytes, l3) << dtype_name(dtype) << ": live bytes after one step";
}

TEST(DistributedOptimizer, Fp32MemoryIs8BytesPerParamOverDp) { check_memory(kFloat32); }
TEST(DistributedOptimizer, Bf16MemoryIs6Plus12OverDpBytesPerParam) { check_memory(kBFloat16); }

// ---- found_inf --------------------------------------------------------------------

// fp16 with loss scaling, grad_stats_group = world: rank 1 alone finds an inf
// (put into its own shard of the averaged gradient, after backward); every rank
// must skip the step, keep params and optimizer state, and halve the scale.
// set_group false: grad_stats_group left unset, the optimizer's default (the
// dp group) must still make every rank skip, or the ranks' all-gathers would
// no longer match (a hang).
void expect_inf_on_one_rank_skips_everywhere(bool set_group) {
  Toy m(kFloat16);
  ZeroDataParallelBucket dp(named(m.params), world(), GradReduce::ReduceScatter, kOneBucket);
  MixedPrecisionOptions o;
  o.adam = kAdam;
  o.loss_scaling = true;
  o.scaler.init_scale = 128.0;
  o.scaler.growth_interval = 1000;
  if (set_group) o.grad_stats_group = &world();
  DistributedOptimizer opt(m.groups(), dp, o);
  EXPECT_FALSE(opt.steps_early()) << "loss scaling needs the global found_inf first";
  const int rank = world().rank();

  auto train_step = [&](int s, bool inject) {
    opt.finish_param_sync();
    backward(opt.scale_loss(loss_of(m, rank, s)));
    if (inject && rank == 1) {
      EXPECT_FALSE(opt.main_params().empty()) << "rank 1 owns part of the buffer";
      if (!opt.main_params().empty()) {
        const MainParam& mp = opt.main_params().back();
        ops::fill_(optim::flat_range(dp.main_grad(mp.model_param), mp.start, mp.start + 1), INFINITY);
      }
    }
    StepResult r = opt.step();
    dp.reset();
    opt.finish_param_sync();
    return r;
  };
  auto snapshot = [&] {
    std::vector<std::vector<float>> s;
    for (const Tensor& p : m.params) s.push_back(values(p));
    for (size_t i = 0; i < opt.main_params().size(); ++i) {
      s.push_back(values(opt.main_params()[i].main));
      s.push_back(values(opt.adam_state(i).exp_avg));
      s.push_back(values(opt.adam_state(i).exp_avg_sq));
      s.push_back({float(opt.adam_state(i).step.item<int64_t>())});
    }
    return s;
  };

  StepResult r0 = train_step(0, false);
  EXPECT_FALSE(r0.skipped);
  EXPECT_EQ(r0.loss_scale, 128.0);
  std::vector<std::vector<float>> before = snapshot();

  StepResult r1 = train_step(1, true);
  EXPECT_TRUE(r1.skipped) << "rank " << rank;
  EXPECT_EQ(r1.loss_scale, 128.0);
  EXPECT_EQ(opt.scaler()->scale(), 64.0) << "rank " << rank;
  std::vector<std::vector<float>> after = snapshot();
  ASSERT_EQ(after.size(), before.size());
  int changed = 0;
  for (size_t i = 0; i < after.size(); ++i) changed += !bitwise_equal(after[i], before[i]);
  EXPECT_EQ(changed, 0) << "rank " << rank << ": tensors changed by a skipped step";
  for (size_t i = 0; i < opt.main_params().size(); ++i) EXPECT_EQ(opt.adam_state(i).step.item<int64_t>(), 1);

  // The next clean step goes through at the halved scale.
  StepResult r2 = train_step(2, false);
  EXPECT_FALSE(r2.skipped);
  EXPECT_EQ(r2.loss_scale, 64.0);
  for (size_t i = 0; i < opt.main_params().size(); ++i) EXPECT_EQ(opt.adam_state(i).step.item<int64_t>(), 2);
  EXPECT_FALSE(bitwise_equal(values(m.params[2]), before[2])) << "params moved";
}

TEST(DistributedOptimizer, AnInfOnOneRankSkipsTheStepOnEveryRank) { expect_inf_on_one_rank_skips_everywhere(true); }

TEST(DistributedOptimizer, AnInfOnOneRankSkipsEverywhereWithTheDefaultStatsGroup) {
  expect_inf_on_one_rank_skips_everywhere(false);
}

}  // namespace
