// ZeRO-1's param all-gather overlapped with the next forward
// (optim/param_gather_overlap.h, Megatron's overlap_param_gather), run by CTest
// on 2 and 4 ranks (dp = world), on a small GPT cut into many buckets, with
// clipping on - and, in fp16, loss scaling - which switch the early steps of
// zero_overlap.h off:
//   - the same numbers as without the overlap, bit for bit (the same step,
//     only the waits move), and as the unsharded optimizer within 1e-5;
//   - when the next forward begins, the all-gathers of every bucket but the
//     first layer's are still not waited for, and each layer finds its own
//     buckets waited for when its forward begins;
//   - a step launches the all-gathers first layer first (the last bucket
//     first): launched the other way round, the numbers and the count of
//     pending gathers stay the same, but the first layer waits for them all.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <set>
#include <vector>

#include "autograd/engine.h"
#include "nn/gpt.h"
#include "nn/loss.h"
#include "optim/distributed_optimizer.h"
#include "optim/param_groups.h"
#include "parallel/comm/distributed.h"
#include "parallel/comm/process_group_decorator.h"
#include "parallel/data_parallel/zero_data_parallel_bucket.h"
#include "tensor/ops.h"

using namespace loom;
using loom::parallel::BucketOptions;
using loom::parallel::DataParallelBucket;
using loom::parallel::GradReduce;
using loom::parallel::ZeroDataParallelBucket;

namespace {

constexpr int kSteps = 5;
constexpr int64_t kRows = 2, kT = 8;
constexpr double kSmallBuckets = 1000.0 * 4 / (1 << 20);  // 1000 fp32: a block is ~3 buckets
constexpr double kMaxNorm = 0.05;                          // below every step's norm: every step clips

nn::GPTConfig config() { return {32, kT, 2, 2, 16, 0.0, 7}; }

parallel::ProcessGroup& world() { return parallel::world(); }

enum class Mode { Unsharded, Zero, ZeroOverlapped };

// The dp group, recording where in its storage each all-gather writes: the
// order in which the optimizer launched them.
class GatherOrder : public parallel::ProcessGroupDecorator {
 public:
  using ProcessGroupDecorator::ProcessGroupDecorator;
  std::shared_ptr<parallel::Work> all_gather_async(const Tensor& output, const Tensor& input) override {
    offsets.push_back(output.offset());
    return inner_.all_gather_async(output, input);
  }
  std::vector<int64_t> offsets;  // each all-gather's first element in the param buffer, in launch order
};

struct Result {
  std::vector<double> losses, norms;
  std::vector<bool> skipped;
  std::vector<std::vector<float>> params;
  std::vector<int> not_waited_at_forward_start;  // per step: buckets whose all-gather is not yet waited for
  int buckets = 0, first_layer_buckets = 0;
  int layers_finding_a_pending_bucket = 0;  // should stay 0
  std::vector<int64_t> gather_offsets;      // GatherOrder::offsets
};

Result train(DType dtype, Mode mode) {
  nn::GPT model(config());
  if (dtype != kFloat32) model.to(dtype);
  const bool zero = mode != Mode::Unsharded;
  GatherOrder group(world());
  std::unique_ptr<DataParallelBucket> bucketed;
  ZeroDataParallelBucket* zero_dp = nullptr;
  if (zero) {
    auto z = std::make_unique<ZeroDataParallelBucket>(model.named_parameters(), group, GradReduce::ReduceScatter,
                                                      kSmallBuckets);
    zero_dp = z.get();
    bucketed = std::move(z);
  } else {
    bucketed = std::make_unique<DataParallelBucket>(model.named_parameters(), group,
                                                    BucketOptions{kSmallBuckets, /*grads_to_params=*/false});
  }
  DataParallelBucket& dp = *bucketed;
  optim::MixedPrecisionOptions o;
  // eps 1e-5, as in test_pipeline.cpp: the attention key bias's true gradient
  // is 0, and with eps 1e-8 AdamW would turn its rounding noise (different in
  // the sharded and unsharded sums) into steps of ~lr.
  o.adam = {0.9, 0.999, 1e-5};
  o.max_grad_norm = kMaxNorm;
  o.loss_scaling = dtype == kFloat16;
  o.scaler.init_scale = 1024;
  if (zero) o.grad_stats_group = &world();  // each rank holds 1/dp of the gradient (unsharded: all of it)
  std::vector<optim::ParamGroup> groups = optim::gpt_param_groups(model, 1e-2, 0.1);
  std::unique_ptr<optim::MixedPrecisionOptimizer> opt;
  optim::DistributedOptimizer* sharded = nullptr;
  if (zero) {
    auto d = std::make_unique<optim::DistributedOptimizer>(groups, *zero_dp, o);
    EXPECT_FALSE(d->steps_early()) << "clipping is on: no bucket is stepped inside backward";
    sharded = d.get();
    opt = std::move(d);
  } else {
    opt = std::make_unique<optim::MixedPrecisionOptimizer>(groups, o, [&dp](const Tensor& p) { return dp.main_grad(p); });
  }
  Result run;
  run.buckets = int(dp.bucket_manager().buckets().size());
  std::vector<autograd::RemovableHandle> probes;
  if (mode == Mode::ZeroOverlapped) {
    sharded->overlap_param_gather(model.layers());
    // Probes, registered after the overlap's hooks, so they run after them: a
    // layer's forward must find every bucket holding one of its params gathered.
    for (size_t i = 0; i < model.layers().size(); ++i) {
      std::set<int> reads;
      for (const Tensor& p : model.layers()[i]->parameters()) reads.insert(dp.bucket_manager().bucket_of(p));
      if (i == 0) run.first_layer_buckets = int(reads.size());
      probes.push_back(model.layers()[i]->register_forward_pre_hook([&, i, reads](nn::Module&, const Tensor&) {
        if (i == 0) {
          int n = 0;
          for (int b = 0; b < run.buckets; ++b) n += sharded->param_gather_pending(b);
          run.not_waited_at_forward_start.push_back(n);
        }
        for (int b : reads) run.layers_finding_a_pending_bucket += sharded->param_gather_pending(b);
      }));
    }
  }
  for (int s = 0; s < kSteps; ++s) {
    Generator g(100 + uint64_t(s));
    const int64_t rows = kRows * world().size();
    Tensor x = randint(0, 32, {rows, kT}, g), y = randint(0, 32, {rows, kT}, g);
    const int64_t r0 = kRows * world().rank();
    x = ops::contiguous(ops::narrow(x, 0, r0, kRows)), y = ops::contiguous(ops::narrow(y, 0, r0, kRows));
    if (mode == Mode::Zero) sharded->finish_param_sync();  // without the overlap: every bucket before forward
    Tensor loss = nn::cross_entropy_loss(model.forward(x), y);
    autograd::backward(opt->scale_loss(loss));
    Tensor mean = full({}, loss.item<double>(), kFloat64);
    world().all_reduce(mean, parallel::ReduceOp::Avg);
    run.losses.push_back(mean.item<double>());
    optim::StepResult r = opt->step();
    run.norms.push_back(r.grad_norm);
    run.skipped.push_back(r.skipped);
    dp.reset();
  }
  if (sharded) sharded->finish_param_sync();
  for (const Tensor& p : model.parameters()) run.params.push_back(ops::to(p, kFloat32).to_vector<float>());
  run.gather_offsets = group.offsets;
  return run;
}

// ||a - b|| / ||b||
double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), n += double(b[i]) * b[i];
  return std::sqrt(d / std::max(n, 1e-30));
}

void expect_overlap_in_flight_and_same_numbers(DType dtype) {
  Result plain = train(dtype, Mode::Zero), overlapped = train(dtype, Mode::ZeroOverlapped);
  ASSERT_GT(overlapped.buckets, overlapped.first_layer_buckets) << "the test needs buckets beyond the first layer's";
  // Bit for bit: the overlap moves the waits, not the arithmetic.
  EXPECT_EQ(overlapped.losses, plain.losses);
  EXPECT_EQ(overlapped.norms, plain.norms);
  EXPECT_EQ(overlapped.params, plain.params);
  for (double n : plain.norms) EXPECT_TRUE(n == 0 || n > kMaxNorm) << "every step clips (or is skipped)";
  // When forward begins (after the first layer's own wait), the all-gathers
  // launched by the last step are still not waited for, except the first layer's.
  ASSERT_EQ(overlapped.not_waited_at_forward_start.size(), size_t(kSteps));
  EXPECT_EQ(overlapped.not_waited_at_forward_start[0], 0) << "step 0: no step before it, nothing gathered";
  for (int s = 1; s < kSteps; ++s) {
    const int want = overlapped.skipped[size_t(s - 1)] ? 0 : overlapped.buckets - overlapped.first_layer_buckets;
    EXPECT_EQ(overlapped.not_waited_at_forward_start[size_t(s)], want) << "step " << s;
  }
  EXPECT_EQ(overlapped.layers_finding_a_pending_bucket, 0) << "a layer ran before its buckets were gathered";
  // Each step's all-gathers, first layer first: the buffer is in reverse layer
  // order, so the offsets decrease within a step (every stepped step launches all).
  const std::vector<int64_t>& at = overlapped.gather_offsets;
  ASSERT_EQ(at.size() % size_t(overlapped.buckets), 0u);
  ASSERT_FALSE(at.empty());
  for (size_t step = 0; step < at.size(); step += size_t(overlapped.buckets))
    for (size_t k = 1; k < size_t(overlapped.buckets); ++k)
      EXPECT_LT(at[step + k], at[step + k - 1]) << "all-gather " << k << " of a step: first layers first";
  if (world().rank() == 0)
    std::printf("[measured] dp=%d %s: %d buckets, %d still in flight when forward begins\n", world().size(),
                dtype_name(dtype), overlapped.buckets, overlapped.not_waited_at_forward_start.back());
}

TEST(ParamGatherOverlap, Fp32ClippedMatchesWithoutOverlapAndGathersAreInFlightAtForward) {
  expect_overlap_in_flight_and_same_numbers(kFloat32);
}

TEST(ParamGatherOverlap, Fp16LossScaledMatchesWithoutOverlapAndGathersAreInFlightAtForward) {
  expect_overlap_in_flight_and_same_numbers(kFloat16);
}

// Against the unsharded optimizer (all-reduce, every main param on every
// rank): losses within 1e-5 relative, final params per tensor within 1e-5
// (||diff|| / ||param||), as the other ZeRO parity tests.
TEST(ParamGatherOverlap, Fp32ClippedMatchesUnsharded) {
  Result ref = train(kFloat32, Mode::Unsharded), got = train(kFloat32, Mode::ZeroOverlapped);
  double worst_loss = 0, worst_param = 0;
  for (size_t s = 0; s < ref.losses.size(); ++s)
    worst_loss = std::max(worst_loss, std::abs(got.losses[s] - ref.losses[s]) / std::abs(ref.losses[s]));
  for (size_t i = 0; i < ref.params.size(); ++i) worst_param = std::max(worst_param, rel_l2(got.params[i], ref.params[i]));
  EXPECT_LE(worst_loss, 1e-5);
  EXPECT_LE(worst_param, 1e-5);
  if (world().rank() == 0)
    std::printf("[measured] dp=%d overlapped ZeRO vs unsharded: losses %.2e, params %.2e\n", world().size(), worst_loss,
                worst_param);
}

}  // namespace
