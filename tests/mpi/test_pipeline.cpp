// Pipeline parallelism on real ranks (CTest runs it on 2 and 4): every run is
// compared with the single-process GPT on the same global batch. Every rank
// also builds the full model and trains it alone (the reference: cheap at this
// size), then checks its own stage against it: per-step losses and gradient
// norms, and final parameters, within 1e-5 relative; the two copies of the
// tied embedding (first and last stage) stay bit-identical after every step.
//
// Not bit-exact, and why: the reference sums the gradient of the whole batch
// inside one GEMM; the pipeline sums m micro-batch gradients one after
// another, adds the tied embedding's two halves with an all-reduce, and (with
// dp) averages replicas. Float addition is not associative. Parameters are
// compared per tensor as ||a - b|| / ||b||, the attention key bias against
// the model's scale, as in test_train_gpt_parallel.cpp (which says why).
// Measured worst cases: losses ~5e-8, gradient norms ~1e-6, parameters
// 2.8e-6 per tensor (the key bias ~5e-9 of the model's scale, with kAdam's eps).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "autograd/engine.h"
#include "autograd/variable.h"
#include "optim/param_groups.h"
#include "nn/gpt.h"
#include "nn/loss.h"
#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "parallel/data_parallel/data_parallel_bucket.h"
#include "parallel/data_parallel/data_parallel_naive.h"
#include "optim/clip_grad.h"
#include "parallel/pipeline_parallel/interleaved_schedule.h"
#include "parallel/pipeline_parallel/pipeline_schedule.h"
#include "parallel/process_group_manager.h"
#include "parallel/pipeline_parallel/shared_weights.h"
#include "parallel/pipeline_parallel/zero_bubble_schedule.h"
#include "tensor/ops.h"

using namespace loom;
using namespace loom::parallel;

namespace {

constexpr int kSteps = 10;
constexpr double kLr = 3e-3, kWeightDecay = 0.1, kMaxNorm = 1.0;
constexpr double kTolerance = 1e-5;
// AdamW's eps is 1e-5 rather than 1e-8 because of the attention key bias: its
// true gradient is exactly 0 (softmax ignores a shift shared by a query's
// scores), so what it gets is rounding noise, ~1e-10, different in every run.
// With eps 1e-8 Adam turns that noise into steps of ~lr/100 in a random
// direction; with 1e-5 into ~lr/1e5, and the comparison sees the real differences.
const optim::AdamWOptions kAdam{0.9, 0.999, 1e-5};
constexpr int64_t kRowsPerMicroBatch = 2, kT = 16;

// V 32, block 16, 2 heads, C 32. 6 blocks = 8 layers (splits evenly over 2 and
// 4 stages); 5 blocks = 7 layers (balanced: uneven stages).
nn::GPTConfig config(int64_t n_layer) { return {32, kT, n_layer, 2, 32, 0.0, 42}; }

struct Setup {
  int dp = 1, pp = 1;
  std::string schedule = "1f1b", partition = "uniform", dp_mode = "bucket";
  int m = 4;  // micro-batches per dp rank
  int v = 1;  // model chunks per stage: interleaved 1F1B when > 1
  int64_t blocks = 0;  // 0: 6 blocks (uniform) or 5 (balanced)
};

struct Batch {
  Tensor x, y;
};
// Step s's global batch, the same on every rank.
Batch global_batch(int step, int64_t rows) {
  Generator g(100 + uint64_t(step));
  return {randint(0, 32, {rows, kT}, g), randint(0, 32, {rows, kT}, g)};
}
Tensor rows(const Tensor& t, int64_t start, int64_t n) { return ops::contiguous(ops::narrow(t, 0, start, n)); }

struct Run {
  std::vector<double> losses, norms;
  std::map<std::string, std::vector<float>> params;
};

// The single-process reference: the whole model on the whole global batch.
Run reference(const nn::GPTConfig& cfg, int64_t global_rows) {
  nn::GPT model(cfg);
  optim::AdamW opt(optim::gpt_param_groups(model, kLr, kWeightDecay), kAdam);
  Run run;
  for (int step = 0; step < kSteps; ++step) {
    Batch b = global_batch(step, global_rows);
    Tensor loss = nn::cross_entropy_loss(model.forward(b.x), b.y);
    autograd::backward(loss);
    run.norms.push_back(optim::clip_grad_norm(model.parameters(), kMaxNorm));
    opt.step();
    opt.zero_grad();
    run.losses.push_back(loss.item<double>());
  }
  for (auto& [name, p] : model.named_parameters()) run.params[name] = p.to_vector<float>();
  return run;
}

// The two copies of wte (first and last stage) hold the same bits.
bool tied_copies_identical(ModelChunks& stage, ProcessGroupManager& pgm) {
  Tensor w = ops::contiguous(stage.embedding_weight());
  Tensor both = zeros({2 * w.numel()}, kFloat32);
  pgm.embedding_group().all_gather(both, ops::reshape(w, {-1}));
  const float* p = both.data<float>();
  return std::memcmp(p, p + w.numel(), size_t(w.numel()) * sizeof(float)) == 0;
}

// The pipeline run, wrapped as train_gpt wraps it: stage -> p2p -> shared
// weights -> data parallel -> optimizer.
Run pipeline(const Setup& s, const nn::GPTConfig& cfg, int64_t global_rows) {
  ProcessGroupManager pgm(s.dp, s.pp);
  StagePartition part = s.partition == "uniform" ? partition_uniform(cfg.num_layers(), s.pp, s.v)
                                                 : partition_balanced(gpt_layer_param_counts(cfg), s.pp, s.v);
  ModelChunks stage(cfg, part[size_t(pgm.pp_rank)]);
  PipelineP2P p2p(pgm.pp_group());
  SharedWeightGradHandler shared = tied_embedding_handler(stage, pgm);
  std::unique_ptr<DataParallel> dp;
  DataParallelBucket* bucket = nullptr;
  if (s.dp > 1 && s.dp_mode == "bucket") {
    auto b = std::make_unique<DataParallelBucket>(stage.named_parameters(), pgm.dp_group(),
                                                  BucketOptions{.bucket_cap_mb = 0.02});
    bucket = b.get();
    dp = std::move(b);
  } else if (s.dp > 1) {
    dp = std::make_unique<DataParallelNaive>(stage.named_parameters(), pgm.dp_group());
  }
  optim::AdamW opt(optim::gpt_param_groups(stage, kLr, kWeightDecay), kAdam);
  // The last stage's wte is a copy: its gradient is already counted on the first stage.
  std::vector<Tensor> not_counted;
  if (s.pp > 1 && stage.is_last_stage()) not_counted.push_back(stage.embedding_weight());

  Run run;
  for (int step = 0; step < kSteps; ++step) {
    Batch b = global_batch(step, global_rows);
    std::vector<MicroBatch> mbs;
    const int64_t first_row = int64_t(pgm.dp_rank) * s.m * kRowsPerMicroBatch;
    for (int i = 0; i < s.m; ++i) {
      int64_t r = first_row + i * kRowsPerMicroBatch;
      mbs.push_back({rows(b.x, r, kRowsPerMicroBatch), rows(b.y, r, kRowsPerMicroBatch)});
    }
    auto schedule = s.v > 1                ? train_step_pipeline_interleaved
                    : s.schedule == "afab"  ? train_step_pipeline_afab
                    : s.schedule == "zb-h1" ? train_step_pipeline_zb_h1
                                            : train_step_pipeline_1f1b;
    LossFn loss_fn = [](const Tensor& logits, const Tensor& y) { return nn::cross_entropy_loss(logits, y); };
    ForwardBackwardResult r = schedule(stage, p2p, mbs, loss_fn, dp.get());
    shared.all_reduce_grads(bucket);
    run.norms.push_back(optim::clip_grad_norm(stage.parameters(), kMaxNorm, &pgm.model_parallel_group(), not_counted));
    opt.step();
    if (dp) dp->zero_grad();
    else opt.zero_grad();

    Tensor loss = full({}, r.loss, kFloat64);
    pgm.dp_group().all_reduce(loss, ReduceOp::Avg);  // the global-batch mean
    run.losses.push_back(loss.item<double>());
    if (s.pp > 1 && pgm.in_embedding_group()) {
      EXPECT_TRUE(tied_copies_identical(stage, pgm)) << "step " << step << ": the two wte copies differ";
    }
  }
  for (auto& [name, p] : stage.named_parameters()) run.params[name] = p.to_vector<float>();
  return run;
}

void expect_matches_single_process(const Setup& s) {
  SCOPED_TRACE(str("dp ", s.dp, " x pp ", s.pp, " x v ", s.v, ", ", s.schedule, ", ", s.partition, " partition, m ",
                   s.m, ", ", s.dp_mode));
  nn::GPTConfig cfg = config(s.blocks > 0 ? s.blocks : s.partition == "uniform" ? 6 : 5);
  const int64_t global_rows = int64_t(s.dp) * s.m * kRowsPerMicroBatch;
  Run want = reference(cfg, global_rows);
  Run got = pipeline(s, cfg, global_rows);

  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], kTolerance * std::abs(want.losses[i])) << "loss, step " << i;
    EXPECT_NEAR(got.norms[i], want.norms[i], kTolerance * std::abs(want.norms[i])) << "grad norm, step " << i;
  }
  // Per tensor: ||got - want|| / ||want||; the key third of each c_attn bias
  // (zero true gradient, see kAdam) as max |diff| over the model's max |param|.
  double scale = 0;
  for (auto& [name, v] : want.params)
    for (float x : v) scale = std::max(scale, double(std::abs(x)));
  for (auto& [name, v] : got.params) {
    const std::vector<float>& w = want.params.at(name);
    ASSERT_EQ(v.size(), w.size()) << name;
    const bool qkv_bias = name.ends_with("attn.c_attn.bias");
    const size_t third = v.size() / 3;
    double d2 = 0, w2 = 0, key_diff = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      const double d = double(v[i]) - double(w[i]);
      if (qkv_bias && i >= third && i < 2 * third) {
        key_diff = std::max(key_diff, std::abs(d));
        continue;
      }
      d2 += d * d, w2 += double(w[i]) * double(w[i]);
    }
    EXPECT_LE(std::sqrt(d2 / std::max(w2, 1e-30)), kTolerance) << "final " << name;
    EXPECT_LE(key_diff / scale, kTolerance) << "final " << name << ", key bias";
  }
}

int world_size() { return parallel::world().size(); }

}  // namespace

// ---- parity with one process --------------------------------------------------------

TEST(Pipeline, AfabMatchesSingleProcess) {
  expect_matches_single_process({1, world_size(), "afab", "uniform", "bucket", 4});
}

TEST(Pipeline, OneFOneBMatchesSingleProcessWithFewerMicroBatchesThanStages) {
  expect_matches_single_process({1, world_size(), "1f1b", "uniform", "bucket", world_size() - 1});
}

TEST(Pipeline, OneFOneBMatchesSingleProcessWithAsManyMicroBatchesAsStages) {
  expect_matches_single_process({1, world_size(), "1f1b", "uniform", "bucket", world_size()});
}

TEST(Pipeline, OneFOneBMatchesSingleProcessWithMoreMicroBatchesThanStages) {
  expect_matches_single_process({1, world_size(), "1f1b", "uniform", "bucket", 2 * world_size()});
}

TEST(Pipeline, BalancedPartitionMatchesSingleProcess) {
  expect_matches_single_process({1, world_size(), "afab", "balanced", "bucket", 3});
  expect_matches_single_process({1, world_size(), "1f1b", "balanced", "bucket", 5});
}

// world = dp 2 × pp (world / 2): dp 2 × pp 2 on 4 ranks; on 2 ranks pp is 1,
// where the schedule runs on one stage and the tied-weight handler does nothing.
TEST(Pipeline, DataParallelTimesPipelineMatchesSingleProcess) {
  for (const char* schedule : {"afab", "1f1b"}) {
    expect_matches_single_process({2, world_size() / 2, schedule, "uniform", "bucket", 3});
    expect_matches_single_process({2, world_size() / 2, schedule, "uniform", "naive", 3});
  }
}

// ---- interleaved 1F1B (virtual stages) ----------------------------------------------------

// Each rank holds v chunks; a micro-batch goes round the ring of ranks v times.
// On 2 ranks: pp 2 x v 2 with m 4 (warm-up, steady 1F1B and cool-down) and m 2
// (= pp: every forward first), pp 2 x v 3 on 4 blocks (6 layers, one per
// chunk: the embedding and the head are chunks of their own). On 4 ranks:
// dp 2 x pp 2 x v 2 with both dp wrappers (bucketed: synced in the last
// backward; naive: in each chunk's last), and pp 4 x v 2.
TEST(Pipeline, InterleavedMatchesSingleProcess) {
  if (world_size() == 2) {
    expect_matches_single_process({1, 2, "1f1b", "uniform", "bucket", 4, 2});
    expect_matches_single_process({1, 2, "1f1b", "uniform", "bucket", 2, 2});
    expect_matches_single_process({1, 2, "1f1b", "uniform", "bucket", 4, 3, 4});
    expect_matches_single_process({1, 2, "1f1b", "balanced", "bucket", 6, 2});
  } else if (world_size() == 4) {
    expect_matches_single_process({2, 2, "1f1b", "uniform", "bucket", 4, 2});
    expect_matches_single_process({2, 2, "1f1b", "uniform", "naive", 2, 2});
    expect_matches_single_process({1, 4, "1f1b", "uniform", "bucket", 4, 2});
  }
}

TEST(Pipeline, InterleavedNeedsMicroBatchesAMultipleOfTheStages) {
  if (world_size() == 1) GTEST_SKIP() << "a pipeline";
  nn::GPTConfig cfg = config(6);
  const int p = world_size();
  ModelChunks stage(cfg, partition_uniform(cfg.num_layers(), p, 2)[size_t(parallel::world().rank())]);
  PipelineP2P p2p(parallel::world());
  std::vector<MicroBatch> mbs(size_t(p + 1), {zeros({2, kT}, kInt64), zeros({2, kT}, kInt64)});
  LossFn loss_fn = [](const Tensor& logits, const Tensor& y) { return nn::cross_entropy_loss(logits, y); };
  std::string err;
  try {
    train_step_pipeline_interleaved(stage, p2p, mbs, loss_fn);
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_NE(err.find(str(p + 1, " micro-batches are not a multiple of pp ", p)), std::string::npos) << err;
}

// ---- zero bubble: the backward split into B and W ------------------------------------------

// ZB-H1 runs the same sums as 1F1B in another order of micro-batches' F, B and
// W: the same losses, norms and parameters, bit for bit, and so the single
// process's. m below, at and above pp; with dp 2 (on 4 ranks) both wrappers:
// their hooks fire in W.
TEST(Pipeline, ZeroBubbleH1IsBitIdenticalTo1F1BAndMatchesSingleProcess) {
  const int p = world_size();
  std::vector<::Setup> setups{{1, p, "zb-h1", "uniform", "bucket", p - 1}, {1, p, "zb-h1", "uniform", "bucket", 2 * p},
                            {1, p, "zb-h1", "balanced", "bucket", 5}};
  if (p == 4) {
    setups.push_back({2, 2, "zb-h1", "uniform", "bucket", 3});
    setups.push_back({2, 2, "zb-h1", "uniform", "naive", 3});
  }
  for (const ::Setup& zb : setups) {
    expect_matches_single_process(zb);
    ::Setup one_f_one_b = zb;
    one_f_one_b.schedule = "1f1b";
    nn::GPTConfig cfg = config(zb.partition == "uniform" ? 6 : 5);
    const int64_t global_rows = int64_t(zb.dp) * zb.m * kRowsPerMicroBatch;
    ::Run a = pipeline(zb, cfg, global_rows), b = pipeline(one_f_one_b, cfg, global_rows);
    SCOPED_TRACE(str("dp ", zb.dp, " x pp ", zb.pp, ", m ", zb.m, ", ", zb.partition, ", ", zb.dp_mode));
    EXPECT_EQ(a.losses, b.losses);
    EXPECT_EQ(a.norms, b.norms);
    ASSERT_EQ(a.params.size(), b.params.size());
    for (const auto& [name, v] : b.params) EXPECT_TRUE(a.params.at(name) == v) << name << " differs from 1F1B's";
  }
}

// ---- shared weights and the model-parallel gradient norm --------------------------------

TEST(Pipeline, SharedWeightGradientsAreSummedOverTheirGroupPerDtypeBucket) {
  ProcessGroup& world = parallel::world();
  const double r = world.rank(), n = world.size();
  // Two fp32 params (one coalesced bucket) and one fp64 param (its own bucket);
  // rank r's gradient element i is (r + 1) * (i + 1), so the sum over ranks is
  // (i + 1) * n (n + 1) / 2.
  std::vector<Tensor> params{zeros({3, 2}), zeros({4}), zeros({5}, kFloat64)};
  SharedWeightGradHandler handler;
  for (const Tensor& p : params) {
    autograd::set_requires_grad(p);
    Tensor g = ops::mul(arange(1.0, double(p.numel()) + 1.0, 1.0, p.dtype()), r + 1);
    autograd::set_grad(p, ops::reshape(g, p.shape()));
    handler.add(p, world);
  }
  handler.all_reduce_grads();
  for (const Tensor& p : params) {
    std::vector<double> got = autograd::grad(p).to_vector<double>();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_DOUBLE_EQ(got[i], double(i + 1) * n * (n + 1) / 2) << p.describe();
  }
}

TEST(Pipeline, ModelParallelGradNormCountsATiedCopyOnce) {
  ProcessGroup& world = parallel::world();
  const int r = world.rank(), n = world.size();
  // Rank r's own param: 4 elements of r + 1. The first and the last rank also
  // hold a copy of a tied weight with gradient 10 (4 elements); the last rank's is not counted.
  Tensor own = zeros({4}), tied = zeros({4});
  autograd::set_requires_grad(own);
  autograd::set_requires_grad(tied);
  autograd::set_grad(own, full({4}, r + 1.0));
  autograd::set_grad(tied, full({4}, 10.0));
  std::vector<Tensor> params{own}, not_counted;
  if (r == 0 || r == n - 1) params.push_back(tied);
  if (r == n - 1) not_counted.push_back(tied);
  double sq = 4 * 100.0;
  for (int k = 1; k <= n; ++k) sq += 4.0 * k * k;
  const double want = std::sqrt(sq);
  // max_norm half the norm: every gradient, the uncounted copy too, is scaled by max_norm / (norm + 1e-6).
  const double norm = optim::clip_grad_norm(params, want / 2, &world, not_counted);
  EXPECT_NEAR(norm, want, 1e-12 * want);
  const double coef = (want / 2) / (want + 1e-6);
  EXPECT_NEAR(autograd::grad(own).to_vector<double>()[0], (r + 1) * coef, 1e-6);
  if (r == 0 || r == n - 1) {
    EXPECT_NEAR(autograd::grad(tied).to_vector<double>()[3], 10 * coef, 1e-6);
  }
}

// ---- stages and transfers -------------------------------------------------------------

TEST(Pipeline, EachRankHoldsOnlyItsStagesParameters) {
  const int pp = world_size();
  nn::GPTConfig cfg = config(6);
  const int64_t V = 32, C = 32, block = 12 * C * C + 13 * C;
  LayerRange range = partition_uniform(cfg.num_layers(), pp)[size_t(parallel::world().rank())][0];
  // By hand: the embedding V C + 16 C, each block 12 C² + 13 C, the head 2 C + V C.
  int64_t want = 0;
  for (int64_t i = range.start; i < range.end; ++i)
    want += i == 0 ? V * C + kT * C : i == cfg.num_layers() - 1 ? 2 * C + V * C : block;

  const int64_t before = memory_stats().live_bytes;
  auto stage = std::make_shared<ModelChunks>(cfg, range);
  const int64_t grown = memory_stats().live_bytes - before;
  EXPECT_EQ(grown, 4 * want);
  // Over the stages: the full model (V C + 16 C + 6 blocks + 2 C) plus the head's copy of wte.
  Tensor total = from_vector<int64_t>({grown});
  parallel::world().all_reduce(total);
  EXPECT_EQ(total.item<int64_t>(), 4 * (V * C + kT * C + 6 * block + 2 * C + V * C));
}

TEST(Pipeline, TransfersCarryTheirShapeAndDtype) {
  PipelineP2P p2p(parallel::world());
  const int r = p2p.pp_rank();
  // Each stage sends three different tensors downstream; the receiver learns
  // shape and dtype from the header alone.
  std::vector<Tensor> sent{full({2, 3}, double(r), kFloat32), from_vector<int64_t>({r, 7, -1}),
                           full({}, 0.5 + r, kFloat64)};
  for (int i = 0; i < 3; ++i) {
    Tensor got = p2p.recv_forward(i);
    if (!p2p.is_first_stage()) {
      Tensor want = i == 0 ? full({2, 3}, double(r - 1), kFloat32)
                           : i == 1 ? from_vector<int64_t>({r - 1, 7, -1}) : full({}, 0.5 + (r - 1), kFloat64);
      EXPECT_EQ(got.shape(), want.shape()) << "tensor " << i;
      EXPECT_EQ(got.dtype(), want.dtype()) << "tensor " << i;
      EXPECT_EQ(got.to_vector<double>(), want.to_vector<double>()) << "tensor " << i;
    } else {
      EXPECT_FALSE(got.defined());
    }
    p2p.send_forward(sent[size_t(i)], i);
  }
}

TEST(Pipeline, CombinedTransfersOfLargeTensorsDoNotDeadlock) {
  // 8 MB each way, far above MPI's eager limit: a blocking send waits for its
  // receive. Stage s sends forward and waits for a gradient while stage s + 1
  // sends that gradient and waits for the activation - on one FIFO group both
  // sends would wait for each other forever.
  PipelineP2P p2p(parallel::world());
  const int r = p2p.pp_rank();
  const int64_t n = 2 << 20;
  if (!p2p.is_last_stage()) {
    Tensor grad = p2p.send_fwd_recv_bwd(full({n}, 1.0 + r, kFloat32), 0, 0);
    ASSERT_TRUE(grad.defined());
    EXPECT_EQ(grad.numel(), n);
    EXPECT_EQ(grad.to_vector<float>()[size_t(n - 1)], -(r + 1.0f));  // the next stage's value
  }
  if (!p2p.is_first_stage()) {
    Tensor act = p2p.send_bwd_recv_fwd(full({n}, -double(r), kFloat32), 0, 0);
    ASSERT_TRUE(act.defined());
    EXPECT_EQ(act.to_vector<float>()[0], float(r));  // 1 + (r - 1)
  }
}

// ---- the data-parallel gradient sync, after the schedule ----------------------------

// DataParallelBucket as the schedule sees it, plus a record of when it is told
// to finish the sync, and a wait of kSlowSync inside that finish: a dp
// reduction that takes that long to come back (a slow network).
constexpr auto kSlowSync = std::chrono::milliseconds(300);

// Step 0's global batch, this dp rank's rows as m micro-batches of kRowsPerMicroBatch.
std::vector<MicroBatch> my_micro_batches(ProcessGroupManager& pgm, int m) {
  Batch b = global_batch(0, int64_t(pgm.dp_size) * m * kRowsPerMicroBatch);
  std::vector<MicroBatch> mbs;
  for (int i = 0; i < m; ++i) {
    int64_t r = (int64_t(pgm.dp_rank) * m + i) * kRowsPerMicroBatch;
    mbs.push_back({rows(b.x, r, kRowsPerMicroBatch), rows(b.y, r, kRowsPerMicroBatch)});
  }
  return mbs;
}
class RecordingDataParallel : public DataParallel {
 public:
  explicit RecordingDataParallel(DataParallelBucket& inner) : inner_(inner) {}
  NoSyncGuard no_sync() override { return inner_.no_sync(); }
  DeferSyncGuard defer_grad_sync() override { return inner_.defer_grad_sync(); }
  void zero_grad() override { inner_.zero_grad(); }
  bool syncs_once_per_step() const override { return inner_.syncs_once_per_step(); }
  void finish_grad_sync() override {
    ++calls;
    launched_at_finish.clear();
    for (const Bucket& b : inner_.bucket_manager().buckets()) launched_at_finish.push_back(b.work != nullptr);
    start_us = schedule_clock_us();
    std::this_thread::sleep_for(kSlowSync);
    inner_.finish_grad_sync();
    end_us = schedule_clock_us();
  }
  int calls = 0;
  double start_us = 0, end_us = 0;
  std::vector<bool> launched_at_finish;  // per bucket: its reduction was launched before finish_grad_sync

 private:
  DataParallelBucket& inner_;
};

// Megatron's order: the synced (last) backward launches the bucket
// all-reduces, the stage sends its last gradient upstream, and only then
// waits for the reductions. So stage s - 1 starts its last backward while
// stage s is still inside its (slow) sync; with the sync inside the last
// backward, as before, it could start only once stage s's sync had ended,
// and the cool-down grew by every stage's sync in turn.
TEST(Pipeline, GradientSyncFinishesAfterTheLastSendBackward) {
  const int dp = world_size() >= 4 ? 2 : 1, pp = world_size() / dp;
  ProcessGroupManager pgm(dp, pp);
  nn::GPTConfig cfg = config(6);
  ModelChunks stage(cfg, partition_uniform(cfg.num_layers(), pp)[size_t(pgm.pp_rank)][0]);
  PipelineP2P p2p(pgm.pp_group());
  DataParallelBucket bucket(stage.named_parameters(), pgm.dp_group(), BucketOptions{.bucket_cap_mb = 0.02});
  RecordingDataParallel dp_wrap(bucket);
  const std::vector<MicroBatch> mbs = my_micro_batches(pgm, 4);
  LossFn loss_fn = [](const Tensor& logits, const Tensor& y) { return nn::cross_entropy_loss(logits, y); };
  for (auto schedule : {train_step_pipeline_afab, train_step_pipeline_1f1b}) {
    dp_wrap.calls = 0;
    ForwardBackwardResult r = schedule(stage, p2p, mbs, loss_fn, &dp_wrap);
    ASSERT_EQ(dp_wrap.calls, 1) << "the schedule finishes the sync once, after its last transfer";
    // The last backward launched every bucket's all-reduce and waited for none.
    for (bool launched : dp_wrap.launched_at_finish) EXPECT_TRUE(launched);
    const ScheduleEvent& last_b = r.events.back();
    ASSERT_EQ(last_b.kind, 'B');
    EXPECT_GE(dp_wrap.start_us, last_b.end_us) << "the sync finishes after the last backward";
    // Every stage's (last backward start, sync start, sync end), on every stage.
    Tensor mine = from_vector<double>({last_b.start_us, dp_wrap.start_us, dp_wrap.end_us});
    Tensor all = zeros({3 * pp}, kFloat64);
    pgm.pp_group().all_gather(all, mine);
    std::vector<double> t = all.to_vector<double>();
    for (int s = 1; s < pp; ++s) {
      const double upstream_last_b_start = t[size_t(3 * (s - 1))], sync_end = t[size_t(3 * s + 2)];
      // Stage s - 1's last backward needs stage s's last gradient: it started
      // while stage s was still waiting for its dp reduction (300 ms of margin).
      EXPECT_LT(upstream_last_b_start, sync_end) << "stage " << s - 1 << " waited for stage " << s << "'s dp sync";
    }
    // The gradients are synced: each dp replica holds the same average.
    Tensor g = ops::contiguous(bucket.bucket_manager().buffer());
    Tensor mean = ops::clone(g);
    pgm.dp_group().all_reduce(mean, ReduceOp::Avg);
    EXPECT_EQ(g.to_vector<float>(), mean.to_vector<float>());
    bucket.reset();
  }
}

// Interleaved 1F1B with bucketed dp: the rank syncs in its last backward
// (B(m-1).0, chunk 0), so every bucket that holds only chunk 0's params is
// launched inside it, not left for finish_grad_sync to launch after the
// schedule - which keeps the numbers and loses all overlap. (Buckets holding a
// later chunk's params got their gradients under no_sync; finish launches them.)
TEST(Pipeline, InterleavedLaunchesTheBucketReductionsInsideTheLastBackward) {
  const int dp = world_size() >= 4 ? 2 : 1, pp = world_size() / dp;
  ProcessGroupManager pgm(dp, pp);
  nn::GPTConfig cfg = config(6);
  ModelChunks stage(cfg, partition_uniform(cfg.num_layers(), pp, 2)[size_t(pgm.pp_rank)]);
  PipelineP2P p2p(pgm.pp_group());
  DataParallelBucket bucket(stage.named_parameters(), pgm.dp_group(), BucketOptions{.bucket_cap_mb = 0.02});
  ASSERT_GT(bucket.bucket_manager().buckets().size(), 2u) << "several buckets, so that some could be left behind";
  RecordingDataParallel dp_wrap(bucket);
  const std::vector<MicroBatch> mbs = my_micro_batches(pgm, 2 * pp);
  LossFn loss_fn = [](const Tensor& logits, const Tensor& y) { return nn::cross_entropy_loss(logits, y); };
  // The buckets whose params all sit in chunk 0's layers.
  std::set<const TensorImpl*> chunk0;
  for (size_t k = 0; k < size_t(stage.range(0).size()); ++k)
    for (const Tensor& p : stage.layers()[k]->parameters()) chunk0.insert(p.impl());
  std::vector<bool> only_chunk0;
  for (const Bucket& b : bucket.bucket_manager().buckets())
    only_chunk0.push_back(std::all_of(b.params.begin(), b.params.end(),
                                      [&](const Tensor& p) { return chunk0.count(p.impl()) > 0; }));
  ASSERT_GE(std::count(only_chunk0.begin(), only_chunk0.end(), true), 1) << "some bucket of chunk 0 alone";
  ForwardBackwardResult r = train_step_pipeline_interleaved(stage, p2p, mbs, loss_fn, &dp_wrap);
  ASSERT_EQ(dp_wrap.calls, 1);
  ASSERT_EQ(dp_wrap.launched_at_finish.size(), only_chunk0.size());
  for (size_t i = 0; i < only_chunk0.size(); ++i) {
    if (only_chunk0[i]) {
      EXPECT_TRUE(dp_wrap.launched_at_finish[i]) << "bucket " << i << " (chunk 0's) inside B(m-1).0";
    }
  }
  EXPECT_GE(dp_wrap.start_us, r.events.back().end_us);
  Tensor g = ops::contiguous(bucket.bucket_manager().buffer());
  Tensor mean = ops::clone(g);
  pgm.dp_group().all_reduce(mean, ReduceOp::Avg);
  EXPECT_EQ(g.to_vector<float>(), mean.to_vector<float>());
}

TEST(Pipeline, RingTransfersOfLargeTensorsDoNotDeadlockInASchedule) {
  // 8 MB each way around the ring, every stage sending before it receives, as
  // the interleaved schedule's stages do (rank p - 1 sends to rank 0). With a
  // blocking send every stage would wait in its send for a receive its peer
  // never reaches; in a schedule a send does not wait for its receiver.
  if (world_size() == 1) GTEST_SKIP() << "a ring";
  PipelineP2P p2p(parallel::world());
  const int r = p2p.pp_rank(), p = p2p.pp_size();
  const int64_t n = 2 << 20;
  p2p.begin_schedule();
  p2p.send_activation(full({n}, 1.0 + r, kFloat32), 0, 0);
  p2p.send_gradient(full({n}, -(1.0 + r), kFloat32), 0, 0);
  Tensor act = p2p.recv_activation(0, 0), grad = p2p.recv_gradient(0, 0);
  p2p.end_schedule();
  EXPECT_EQ(act.to_vector<float>()[size_t(n - 1)], float(1 + (r - 1 + p) % p));  // from the previous rank
  EXPECT_EQ(grad.to_vector<float>()[0], -float(1 + (r + 1) % p));              // from the next rank
}

TEST(Pipeline, AScheduleAnnouncesEachChannelsShapeOnce) {
  // In a schedule the header goes with the first tensor of each channel only,
  // so a later tensor of another shape cannot be announced: the sender stops,
  // naming both shapes. The next schedule announces afresh.
  if (world_size() != 2) GTEST_SKIP() << "a two-stage exchange";
  PipelineP2P p2p(parallel::world());
  for (int schedule = 0; schedule < 2; ++schedule) {
    const Shape shape{2, schedule + 3};
    p2p.begin_schedule();
    if (p2p.is_first_stage()) {
      p2p.send_forward(full(shape, 1.0), 0);
      p2p.send_forward(full(shape, 2.0), 1);  // the same shape: payload only
      std::string err;
      try {
        p2p.send_forward(full({4}, 3.0), 2);
      } catch (const Error& e) {
        err = e.what();
      }
      EXPECT_NE(err.find(str("send_forward: stage 0 sends [4] float32 in a schedule whose first transfer on this "
                             "channel was ", shape_str(shape), " float32")),
                std::string::npos)
          << err;
    } else {
      Tensor a = p2p.recv_forward(0), b = p2p.recv_forward(1);
      EXPECT_EQ(a.shape(), shape);
      EXPECT_EQ(b.shape(), shape);
      EXPECT_EQ(b.to_vector<float>().back(), 2.0f);
    }
    p2p.end_schedule();
  }
}

TEST(Pipeline, InAScheduleSendForwardReturnsBeforeTheNextStageReceives) {
  // What AFAB and 1F1B gain (pipeline_channels.h): stage 0's send_forward returns
  // while stage 1 is still busy elsewhere, and stage 0 goes on computing. 8 MB
  // is far above MPI's eager limit, so a send that waited for its transfer
  // would wait for the receive. Stage 0 tells stage 1 over another group that
  // its send has returned; stage 1 posts its receive only once it has heard
  // that, or after giving up (5 s), so a send that waits fails, not hangs.
  if (world_size() != 2) GTEST_SKIP() << "a two-stage exchange";
  PipelineP2P p2p(parallel::world());
  const int64_t n = 2 << 20;
  constexpr int kReturnedTag = 7;
  p2p.begin_schedule();
  if (p2p.is_first_stage()) {
    p2p.send_forward(full({n}, 3.0), 0);
    parallel::world().send(full({1}, 1.0, kInt32), 1, kReturnedTag);
  } else {
    Tensor returned = zeros({1}, kInt32);
    std::shared_ptr<Work> heard = parallel::world().recv_async(returned, 0, kReturnedTag);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!heard->is_completed() && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const bool heard_before_receiving = heard->is_completed();
    Tensor got = p2p.recv_forward(0);
    heard->wait();
    EXPECT_TRUE(heard_before_receiving) << "stage 0's send_forward waited for this receive";
    EXPECT_EQ(returned.to_vector<int32_t>()[0], 1);
    EXPECT_EQ(got.numel(), n);
    EXPECT_EQ(got.to_vector<float>()[size_t(n - 1)], 3.0f);
  }
  p2p.end_schedule();
}
