// Data parallelism (naive and bucketed) against one process, run by CTest on
// 2, 3 and 4 ranks. The dp run must reproduce the single-process run on the
// same global batch: each dp rank takes its own slice, the averaged gradient
// is the gradient of the global-batch mean, so per-step losses and final
// parameters agree.
//
// Not bit-exact, and why: the single process sums the batch's gradient
// contributions in one order inside one GEMM; dp sums each slice on its rank,
// then the all-reduce adds the slices' sums (in MPI's order) and divides by
// dp. Floating-point addition is not associative, so results differ in the
// last bits (~1e-7 relative per step). The tolerance is 1e-5 relative, with
// "relative" meaning max |a - b| / max |b| over a tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "parallel/data_parallel/data_parallel_bucket.h"
#include "parallel/data_parallel/data_parallel_naive.h"
#include "parallel/data_parallel/zero_data_parallel_bucket.h"
#include "parallel/comm/distributed.h"
#include "tensor/grad_mode.h"

using namespace loom;
using namespace loom::autograd;
using namespace loom::parallel;

namespace {

constexpr uint64_t kSeed = 7;
constexpr int kSteps = 5;
constexpr int64_t kGlobalBatch = 24;  // divisible by 1, 2, 3, 4 ranks and by 2 micro-batches
constexpr double kLr = 0.5;
constexpr double kTolerance = 1e-5;

// x: [B, 8] -> gelu(x @ w1 + b1): [B, 16] -> @ w2 + b2 + frozen: [B, 5] logits -> cross-entropy.
// `frozen` does not require grad.
struct Mlp {
  Tensor w1, b1, w2, b2, frozen;
  explicit Mlp(uint64_t seed) {
    Generator g(seed);
    w1 = randn({8, 16}, g, kFloat32, 0.0, 0.5);
    b1 = randn({16}, g, kFloat32, 0.0, 0.1);
    w2 = randn({16, 5}, g, kFloat32, 0.0, 0.5);
    b2 = randn({5}, g, kFloat32, 0.0, 0.1);
    frozen = randn({5}, g, kFloat32, 0.0, 0.1);
    for (Tensor* p : {&w1, &b1, &w2, &b2}) set_requires_grad(*p);
  }
  NamedParams named() const { return {{"w1", w1}, {"b1", b1}, {"w2", w2}, {"b2", b2}, {"frozen", frozen}}; }
  std::vector<Tensor> trainable() const { return {w1, b1, w2, b2}; }
  Tensor loss(const Tensor& x, const Tensor& y) const {
    Tensor h = gelu(matmul(x, w1) + b1);
    return cross_entropy(matmul(h, w2) + b2 + frozen, y);
  }
};

struct Batch {
  Tensor x, y;
};
// Step s's global batch: the same on every rank.
Batch global_batch(int step) {
  Generator g(1000 + uint64_t(step));
  return {randn({kGlobalBatch, 8}, g), randint(0, 5, {kGlobalBatch}, g)};
}
Batch rows(const Batch& b, int64_t start, int64_t n) {
  return {ops::contiguous(ops::narrow(b.x, 0, start, n)), ops::contiguous(ops::narrow(b.y, 0, start, n))};
}

void sgd_step(const std::vector<Tensor>& params) {
  NoGradGuard no_grad;
  for (const Tensor& p : params) ops::add_(p, grad(p), -kLr);
}

struct Run {
  std::vector<double> losses;
  std::vector<std::vector<float>> params;  // w1, b1, w2, b2, frozen after training
};

std::vector<std::vector<float>> values(const Mlp& m) {
  std::vector<std::vector<float>> v;
  for (auto& [name, p] : m.named()) v.push_back(p.to_vector<float>());
  return v;
}

// The reference: one process, the whole global batch, rank 0's initial weights.
Run train_single_process() {
  Mlp m(kSeed);
  Run run;
  for (int s = 0; s < kSteps; ++s) {
    Batch b = global_batch(s);
    Tensor loss = m.loss(b.x, b.y);
    backward(loss);
    run.losses.push_back(loss.item<double>());
    sgd_step(m.trainable());
    zero_grad(m.trainable());
  }
  run.params = values(m);
  return run;
}

enum class Mode { Naive, Bucket };

struct DpOptions {
  Mode mode = Mode::Bucket;
  int grad_accum = 1;          // micro-batches per step, all but the last under no_sync
  double bucket_cap_mb = 25.0;
};

// dp = world size. Each rank starts from *different* weights (seed + rank):
// wrapping must broadcast rank 0's. Micro-batch k of a step is rows
// [k*M, (k+1)*M) of the global batch (M = B / grad_accum), and rank r takes
// its 1/dp of those.
Run train_data_parallel(const DpOptions& opt) {
  ProcessGroup& dp = parallel::world();
  Mlp m(kSeed + uint64_t(dp.rank()));
  std::unique_ptr<DataParallelNaive> naive;
  std::unique_ptr<DataParallelBucket> bucket;
  if (opt.mode == Mode::Naive) naive = std::make_unique<DataParallelNaive>(m.named(), dp);
  else bucket = std::make_unique<DataParallelBucket>(m.named(), dp, 
                                                          BucketOptions{.bucket_cap_mb = opt.bucket_cap_mb});

  const int64_t micro = kGlobalBatch / opt.grad_accum, local = micro / dp.size();
  Run run;
  for (int s = 0; s < kSteps; ++s) {
    Batch b = global_batch(s);
    double step_loss = 0;
    for (int k = 0; k < opt.grad_accum; ++k) {
      Batch mine = rows(b, k * micro + dp.rank() * local, local);
      Tensor loss = m.loss(mine.x, mine.y) * (1.0 / opt.grad_accum);
      step_loss += loss.item<double>();
      if (k == opt.grad_accum - 1) {
        backward(loss);  // syncs
      } else if (naive) {
        auto guard = naive->no_sync();
        backward(loss);
      } else {
        auto guard = bucket->no_sync();
        backward(loss);
      }
    }
    // The logged loss: the global-batch mean = the mean of the ranks' means.
    Tensor l = from_vector<double>({step_loss});
    dp.all_reduce(l, ReduceOp::Avg);
    run.losses.push_back(l.item<double>());
    sgd_step(m.trainable());
    if (bucket) bucket->reset();
    else zero_grad(m.trainable());
  }
  run.params = values(m);
  return run;
}

double relative_error(const std::vector<float>& a, const std::vector<float>& ref) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(ref[i])));
    scale = std::max(scale, std::abs(double(ref[i])));
  }
  return diff / scale;
}

void expect_same_run(const Run& dp, const Run& ref) {
  ASSERT_EQ(dp.losses.size(), ref.losses.size());
  for (size_t s = 0; s < ref.losses.size(); ++s)
    EXPECT_LE(std::abs(dp.losses[s] - ref.losses[s]), kTolerance * std::abs(ref.losses[s]))
        << "step " << s << ": dp " << dp.losses[s] << " vs single " << ref.losses[s];
  const char* names[] = {"w1", "b1", "w2", "b2", "frozen"};
  for (size_t i = 0; i < ref.params.size(); ++i)
    EXPECT_LE(relative_error(dp.params[i], ref.params[i]), kTolerance) << names[i];
  // Training moved the weights: the comparison is not between two initialisations.
  EXPECT_GT(ref.losses.front() - ref.losses.back(), 0.05);
}

const Run& reference() {
  static Run ref = train_single_process();
  return ref;
}

// The bucket cap that holds `elements` fp32 values.
double cap_of(double elements) { return elements * 4 / (1024.0 * 1024.0); }
int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

}  // namespace

TEST(DataParallelNaive, MatchesSingleProcess) { expect_same_run(train_data_parallel({Mode::Naive}), reference()); }

TEST(DataParallelBucket, MatchesSingleProcess) { expect_same_run(train_data_parallel({Mode::Bucket}), reference()); }

// Two micro-batches per step, the first under no_sync: the same as the whole batch at once.
TEST(DataParallelNaive, NoSyncAccumulationEqualsTheLargerBatch) {
  expect_same_run(train_data_parallel({Mode::Naive, 2}), reference());
}

// Inside no_sync nothing is communicated: each rank keeps its own micro-batch's
// gradient, bit for bit - not the average over ranks. (The accumulation tests
// above cannot tell: averaging is linear, so syncing every micro-batch would
// give the same sums.) `local` is an unwrapped copy with rank 0's weights.
template <class DP>
void expect_no_sync_keeps_each_ranks_own_gradient() {
  ProcessGroup& dp = parallel::world();
  Mlp m(kSeed + uint64_t(dp.rank()));
  DP ddp(m.named(), dp);  // broadcasts rank 0's weights
  Mlp local(kSeed);
  Batch b = rows(global_batch(0), dp.rank() * 4, 4);
  {
    auto guard = ddp.no_sync();
    backward(m.loss(b.x, b.y));
  }
  // Nor is anything in flight: an all-reduce launched but not yet waited for
  // has not written main_grad yet, and the comparison below could not tell.
  if constexpr (std::is_same_v<DP, DataParallelBucket>) {
    for (const Bucket& bucket : ddp.bucket_manager().buckets()) EXPECT_EQ(bucket.work, nullptr) << "a bucket launched";
  }
  backward(local.loss(b.x, b.y));
  const std::vector<Tensor> mine = m.trainable(), expected = local.trainable();
  for (size_t i = 0; i < mine.size(); ++i) {
    Tensor g;
    if constexpr (std::is_same_v<DP, DataParallelBucket>) g = ddp.main_grad(mine[i]);
    else g = grad(mine[i]);
    EXPECT_EQ(g.template to_vector<float>(), grad(expected[i]).template to_vector<float>()) << "param " << i;
  }
}

TEST(DataParallelNaive, NoSyncKeepsEachRanksOwnGradient) {
  expect_no_sync_keeps_each_ranks_own_gradient<DataParallelNaive>();
}

TEST(DataParallelBucket, NoSyncKeepsEachRanksOwnGradient) {
  expect_no_sync_keeps_each_ranks_own_gradient<DataParallelBucket>();
}

TEST(DataParallelBucket, NoSyncAccumulationEqualsTheLargerBatch) {
  expect_same_run(train_data_parallel({Mode::Bucket, 2}), reference());
  expect_same_run(train_data_parallel({Mode::Bucket, 2, cap_of(1)}), reference());
}

// Params w1 [8,16] = 128, b1 [16], w2 [16,5] = 80, b2 [5], in reverse: b2, w2 | b1 | w1.
// A cap of 100 elements: b2 + w2 = 85 fits, b1 would make 101 and opens bucket 1,
// w1 (128, larger than the cap) gets bucket 2 to itself. Buckets end padded to
// a multiple of dp x 64 elements.
TEST(DataParallelBucket, ParamLargerThanTheCapGetsItsOwnBucket) {
  ProcessGroup& dp = parallel::world();
  Mlp m(kSeed);
  DataParallelBucket ddp(m.named(), dp, {.bucket_cap_mb = cap_of(100)});
  const BucketManager& bm = ddp.bucket_manager();
  const int64_t P = 64 * dp.size();
  ASSERT_EQ(bm.buckets().size(), 3u);
  EXPECT_EQ(bm.bucket_of(m.b2), 0);
  EXPECT_EQ(bm.bucket_of(m.w2), 0);
  EXPECT_EQ(bm.bucket_of(m.b1), 1);
  EXPECT_EQ(bm.bucket_of(m.w1), 2);
  EXPECT_EQ(bm.buckets()[0].offset, 0);
  EXPECT_EQ(bm.buckets()[0].numel, round_up(85, P));
  EXPECT_EQ(bm.buckets()[1].offset, round_up(85, P));
  EXPECT_EQ(bm.buckets()[1].numel, P);
  EXPECT_EQ(bm.buckets()[2].numel, round_up(128, P));
  EXPECT_EQ(bm.buffer().numel(), round_up(85, P) + P + round_up(128, P));
  EXPECT_EQ(bm.buffer().numel() % P, 0);  // shards evenly over dp ranks
  // main_grad views: reverse parameter order, front to back.
  auto offset = [&](const Tensor& p) {
    return static_cast<const float*>(ddp.main_grad(p).raw_data()) - static_cast<const float*>(bm.buffer().raw_data());
  };
  EXPECT_EQ(offset(m.b2), 0);
  EXPECT_EQ(offset(m.w2), 5);
  EXPECT_EQ(offset(m.b1), round_up(85, P));
  EXPECT_EQ(offset(m.w1), round_up(85, P) + P);
  EXPECT_EQ(ddp.main_grad(m.w1).shape(), (Shape{8, 16}));
  EXPECT_EQ(ddp.main_grad(m.w1).dtype(), kFloat32);
  expect_same_run(train_data_parallel({Mode::Bucket, 1, cap_of(100)}), reference());
}

TEST(DataParallelBucket, TinyCapGivesOneBucketPerParam) {
  Mlp m(kSeed);
  DataParallelBucket ddp(m.named(), parallel::world(), {.bucket_cap_mb = cap_of(1)});
  EXPECT_EQ(ddp.bucket_manager().buckets().size(), 4u);
  expect_same_run(train_data_parallel({Mode::Bucket, 1, cap_of(1)}), reference());
}

TEST(DataParallelBucket, HugeCapGivesOneBucket) {
  Mlp m(kSeed);
  DataParallelBucket ddp(m.named(), parallel::world(), {.bucket_cap_mb = 1000.0});
  ASSERT_EQ(ddp.bucket_manager().buckets().size(), 1u);
  EXPECT_EQ(ddp.bucket_manager().buckets()[0].params.size(), 4u);
  expect_same_run(train_data_parallel({Mode::Bucket, 1, 1000.0}), reference());
}

// `frozen` is broadcast with the rest but has no main_grad and never gets a grad.
TEST(DataParallelBucket, ParamThatDoesNotRequireGradIsSkipped) {
  ProcessGroup& dp = parallel::world();
  Mlp m(kSeed + uint64_t(dp.rank()));
  DataParallelBucket ddp(m.named(), dp);
  EXPECT_EQ(ddp.params().size(), 4u);
  EXPECT_THROW(ddp.main_grad(m.frozen), Error);
  EXPECT_EQ(m.frozen.to_vector<float>(), Mlp(kSeed).frozen.to_vector<float>());  // rank 0's values
  Batch b = rows(global_batch(0), 0, 4);
  backward(m.loss(b.x, b.y));
  EXPECT_FALSE(grad(m.frozen).defined());
  EXPECT_TRUE(grad(m.w1).defined());
}

// The overlap itself: when the last gradient (w1's) arrives, the buckets of the
// layers after it have already been launched - during backward, before the
// engine's callback has handed any gradient back.
TEST(DataParallelBucket, AllReducesAreLaunchedDuringBackward) {
  Mlp m(kSeed);
  DataParallelBucket ddp(m.named(), parallel::world(), {.bucket_cap_mb = cap_of(1)});
  std::vector<bool> launched;
  bool grads_handed_back = true;
  RemovableHandle probe = register_post_accumulate_grad_hook(m.w1, [&](Tensor&) {
    for (const Bucket& b : ddp.bucket_manager().buckets()) launched.push_back(b.work != nullptr);
    grads_handed_back = grad(m.b2).defined();
  });
  Batch b = rows(global_batch(0), 0, 4);
  backward(m.loss(b.x, b.y));
  EXPECT_EQ(launched, (std::vector<bool>{true, true, true, true}));
  EXPECT_FALSE(grads_handed_back);
  EXPECT_TRUE(grad(m.b2).defined());  // after backward: handed back
  EXPECT_TRUE(grad(m.b2).storage() == ddp.bucket_manager().buffer().storage());  // fp32: a view of main_grad
}

// The same overlap for ZeRO-1's reduce-scatters: launched from the bucket hook
// during backward, not in the callback after it.
TEST(DataParallelBucket, ReduceScattersAreLaunchedDuringBackward) {
  Mlp m(kSeed);
  ZeroDataParallelBucket ddp(m.named(), parallel::world(), GradReduce::ReduceScatter, cap_of(1));
  std::vector<bool> launched;
  RemovableHandle probe = register_post_accumulate_grad_hook(m.w1, [&](Tensor&) {
    for (const Bucket& b : ddp.bucket_manager().buckets()) launched.push_back(b.work != nullptr);
  });
  Batch b = rows(global_batch(0), 0, 4);
  backward(m.loss(b.x, b.y));
  EXPECT_EQ(launched, (std::vector<bool>{true, true, true, true}));
  EXPECT_FALSE(grad(m.b2).defined());  // ZeRO: each rank keeps its shard of main_grad, no .grad
}

TEST(DataParallelBucket, BackwardAfterASyncWithoutResetIsAnError) {
  Mlp m(kSeed);
  DataParallelBucket ddp(m.named(), parallel::world());
  Batch b = rows(global_batch(0), 0, 4);
  backward(m.loss(b.x, b.y));
  try {
    backward(m.loss(b.x, b.y));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without reset()"), std::string::npos) << e.what();
  }
  ddp.reset();
  backward(m.loss(b.x, b.y));  // fine again
  EXPECT_TRUE(grad(m.w1).defined());
}

// A bf16 param: main_grad is fp32, .grad is handed back rounded to bf16.
// Rank r's gradient is (r + 1) * [1, 2, 3, 4]; the mean is (S + 1)/2 * [1, 2, 3, 4].
TEST(DataParallelBucket, HalfPrecisionParamGetsItsGradInItsDtype) {
  ProcessGroup& dp = parallel::world();
  const double S = dp.size();
  Tensor p = zeros({4}, kBFloat16);
  set_requires_grad(p);
  DataParallelBucket ddp({{"p", p}}, dp);
  Tensor c = ops::to(tensor({1, 2, 3, 4}) * double(dp.rank() + 1), kBFloat16);
  backward(sum(mul(p, c)));
  std::vector<double> expected;
  for (double i = 1; i <= 4; ++i) expected.push_back((S + 1) / 2 * i);
  EXPECT_EQ(grad(p).dtype(), kBFloat16);
  EXPECT_EQ(ops::to(grad(p), kFloat64).to_vector<double>(), expected);
  EXPECT_EQ(ops::to(ddp.main_grad(p), kFloat64).to_vector<double>(), expected);
}
