// Gradient synchronisation at its edges, on 2 ranks: when exactly a bucket's
// reduction is launched (after its last gradient, not before; buckets in the
// order backward completes them; a bucket that never completes is launched by
// wait()), and the shared-weight handler on a copy that got no gradient.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "parallel/comm/distributed.h"
#include "parallel/data_parallel/bucket.h"
#include "parallel/data_parallel/data_parallel_bucket.h"
#include "parallel/data_parallel/grad_shards.h"
#include "parallel/comm/process_group_decorator.h"
#include "parallel/pipeline_parallel/shared_weights.h"
#include "tensor/ops.h"

using namespace loom;
using namespace loom::parallel;

namespace {

// Forwards to a real group and records each collective as "<op> <numel>", in
// the order they were issued.
class RecordingGroup final : public ProcessGroupDecorator {
 public:
  using ProcessGroupDecorator::ProcessGroupDecorator;
  std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override {
    calls.push_back("all_reduce " + std::to_string(t.numel()));
    return inner_.all_reduce_async(t, op);
  }
  std::shared_ptr<Work> reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) override {
    calls.push_back("reduce_scatter " + std::to_string(in.numel()));
    return inner_.reduce_scatter_async(out, in, op);
  }

  std::vector<std::string> calls;
};

using Calls = std::vector<std::string>;

// Params a [100], b [200], c [300], d [400] (module order) with a cap of 750
// fp32 elements: reversed, d and c fill bucket 0 (b would make it 900: b
// opens bucket 1), b and a fill bucket 1. Padded to dp x 64 elements each.
struct FourParams {
  std::vector<Tensor> params = {zeros({100}), zeros({200}), zeros({300}), zeros({400})};
  FourParams() {
    for (Tensor& p : params) autograd::set_requires_grad(p);
  }
  const Tensor& a() const { return params[0]; }
  const Tensor& b() const { return params[1]; }
  const Tensor& c() const { return params[2]; }
  const Tensor& d() const { return params[3]; }
};

constexpr double kCapMb = 750.0 * 4 / (1024 * 1024);  // MiB, as BucketManager counts

int64_t padded(int64_t n) {
  const int64_t unit = kBucketPadElements * world().size();
  return (n + unit - 1) / unit * unit;
}

// Fills p's main_grad with (rank + 1) * (i + 1) and marks it ready.
void produce_grad(BucketManager& bm, const Tensor& p) {
  const Tensor& g = bm.main_grad(p);
  std::vector<float> v(size_t(g.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float((world().rank() + 1) * (i + 1));
  ops::copy_(g, from_vector(v));
  bm.mark_param_ready(p);
}

// The dp average of produce_grad's values: (S + 1) / 2 * (i + 1).
void expect_averaged(const BucketManager& bm, const Tensor& p) {
  const double S = world().size();
  std::vector<float> got = bm.main_grad(p).to_vector<float>();
  for (size_t i = 0; i < got.size(); i += 37) EXPECT_EQ(got[i], float((S + 1) / 2 * double(i + 1))) << i;
}

}  // namespace

// Backward produces d, c (bucket 0 complete), then b, a (bucket 1 complete).
// Each bucket's all-reduce is issued by the mark that completes it - not one
// mark earlier - and the buckets go out in the order they completed.
TEST(BucketLaunch, OnlyAfterTheLastGradientOfTheBucketInCompletionOrder) {
  if (world().size() == 1) GTEST_SKIP() << "a size-1 group still reduces, but this checks a 2-rank launch";
  RecordingGroup group(world());
  FourParams m;
  BucketManager bm(m.params, group, kCapMb);
  ASSERT_EQ(bm.buckets().size(), 2u);
  ASSERT_EQ(bm.bucket_of(m.d()), 0);
  ASSERT_EQ(bm.bucket_of(m.a()), 1);
  const std::string bucket0 = "all_reduce " + std::to_string(padded(700));
  const std::string bucket1 = "all_reduce " + std::to_string(padded(300));

  produce_grad(bm, m.d());
  EXPECT_EQ(group.calls, Calls{}) << "bucket 0 launched before c's gradient";
  produce_grad(bm, m.c());
  EXPECT_EQ(group.calls, Calls{bucket0});
  produce_grad(bm, m.b());
  EXPECT_EQ(group.calls, Calls{bucket0}) << "bucket 1 launched before a's gradient";
  produce_grad(bm, m.a());
  EXPECT_EQ(group.calls, (Calls{bucket0, bucket1}));
  bm.wait();
  EXPECT_EQ(group.calls, (Calls{bucket0, bucket1})) << "wait() launched a bucket again";
  for (const Tensor& p : m.params) expect_averaged(bm, p);

  // Within a bucket, the order of its gradients does not matter: the last
  // one launches it. The next step, in the other order within each bucket.
  bm.reset();
  group.calls.clear();
  produce_grad(bm, m.c());
  produce_grad(bm, m.a());
  EXPECT_EQ(group.calls, Calls{});
  produce_grad(bm, m.d());
  EXPECT_EQ(group.calls, Calls{bucket0});
  produce_grad(bm, m.b());
  EXPECT_EQ(group.calls, (Calls{bucket0, bucket1}));
  bm.wait();
  for (const Tensor& p : m.params) expect_averaged(bm, p);
}

TEST(BucketLaunch, ReduceScatterModeLaunchesAtTheSameMoments) {
  if (world().size() == 1) GTEST_SKIP() << "a size-1 group still reduces, but this checks a 2-rank launch";
  RecordingGroup group(world());
  FourParams m;
  ShardedBuckets bm(m.params, group, kCapMb);
  produce_grad(bm, m.d());
  EXPECT_EQ(group.calls, Calls{});
  produce_grad(bm, m.c());
  EXPECT_EQ(group.calls, Calls{"reduce_scatter " + std::to_string(padded(700))});
  produce_grad(bm, m.b());
  produce_grad(bm, m.a());
  EXPECT_EQ(group.calls.size(), 2u);
  bm.wait();
}

// A bucket whose params get no gradient this step (a branch of the model not
// taken) is launched by wait(), after the complete ones, on every rank alike:
// the missing gradient reduces as zeros.
TEST(BucketLaunch, ABucketThatNeverCompletesIsLaunchedByWait) {
  RecordingGroup group(world());
  FourParams m;
  BucketManager bm(m.params, group, kCapMb);
  produce_grad(bm, m.b());  // bucket 1 complete but for a
  produce_grad(bm, m.d());
  produce_grad(bm, m.c());  // bucket 0 complete
  const std::string bucket0 = "all_reduce " + std::to_string(padded(700));
  const std::string bucket1 = "all_reduce " + std::to_string(padded(300));
  EXPECT_EQ(group.calls, Calls{bucket0});
  bm.wait();
  EXPECT_EQ(group.calls, (Calls{bucket0, bucket1}));
  expect_averaged(bm, m.b());
  expect_averaged(bm, m.c());
  expect_averaged(bm, m.d());
  EXPECT_EQ(bm.main_grad(m.a()).to_vector<float>(), std::vector<float>(100, 0.f));
}

// The tied embedding's copy on a stage whose backward never reached it (no
// .grad at all) still joins the all-reduce, with zeros: both copies end with
// the other's gradient. Rank 0 has gradient 1, 2, 3; rank 1 none.
TEST(SharedWeights, ACopyWithoutAGradientContributesZeros) {
  if (world().size() == 1) GTEST_SKIP() << "a weight shared by one rank is skipped";
  Tensor w = zeros({3});
  autograd::set_requires_grad(w);
  if (world().rank() == 0) autograd::set_grad(w, from_vector<float>({1, 2, 3}));
  SharedWeightGradHandler handler;
  handler.add(w, world());
  handler.all_reduce_grads();
  ASSERT_TRUE(autograd::grad(w).defined()) << "rank " << world().rank();
  EXPECT_EQ(autograd::grad(w).to_vector<float>(), (std::vector<float>{1, 2, 3})) << "rank " << world().rank();
}

// A bf16 shared weight under bucketed dp that hands gradients back to the
// params: after the sum over the embedding group, .grad is refreshed from the
// summed fp32 main_grad (rounded to bf16 once), not left at this copy's own
// part. Rank r's part is (r + 1) x [1, 2, 3]; each rank is a dp group of one.
TEST(SharedWeights, AHalfPrecisionCopysGradIsRefreshedFromTheSum) {
  if (world().size() == 1) GTEST_SKIP() << "a weight shared by one rank is skipped";
  std::unique_ptr<ProcessGroup> solo = world().split(world().rank(), 0, "solo_dp");
  Tensor w = zeros({3}, kBFloat16);
  autograd::set_requires_grad(w);
  DataParallelBucket dp({{"w", w}}, *solo, BucketOptions{.grads_to_params = true});
  const float r = float(world().rank() + 1);
  ops::copy_(dp.main_grad(w), from_vector<float>({r, 2 * r, 3 * r}));
  autograd::set_grad(w, ops::to(dp.main_grad(w), kBFloat16));  // this copy's own part, as after its backward
  SharedWeightGradHandler handler;
  handler.add(w, world());
  handler.all_reduce_grads(&dp);
  // Sum over n ranks of (r + 1) = n (n + 1) / 2, exact in bf16 for n <= 4.
  const int n = world().size();
  const float s = float(n * (n + 1) / 2);
  EXPECT_EQ(dp.main_grad(w).to_vector<float>(), (std::vector<float>{s, 2 * s, 3 * s}));
  EXPECT_EQ(autograd::grad(w).dtype(), kBFloat16);
  EXPECT_EQ(ops::to(autograd::grad(w), kFloat32).to_vector<float>(), (std::vector<float>{s, 2 * s, 3 * s}))
      << "rank " << world().rank() << ": .grad still holds this copy's own part";
}
