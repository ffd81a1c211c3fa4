// finalize_model_grads (parallel/finalize_model_grads.h) on real ranks, without
// train_gpt: after forward_backward, the tied embedding's gradient on the first
// and on the last stage is the whole model's (summed over the embedding group,
// after the dp sync); under sequence parallelism each replicated layernorm's
// gradient is the whole model's (summed over tp); the copies are made equal at
// construction; and the norm group and the counted-once list follow the grid.
// Every rank compares against the single-process GPT on the same global batch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "autograd/engine.h"
#include "autograd/variable.h"
#include "nn/gpt.h"
#include "nn/loss.h"
#include "parallel/comm/distributed.h"
#include "parallel/data_parallel/wrap.h"
#include "parallel/finalize_model_grads.h"
#include "parallel/forward_backward.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

using namespace loom;
using namespace loom::parallel;

namespace {

constexpr int64_t kT = 16, kRows = 8;  // the global batch: 8 sequences of 16 tokens

// V 32, 4 heads, C 32 (heads and the MLP split over tp 2 and 4), 2 blocks = 4 layers.
nn::GPTConfig config() { return {32, kT, 2, 4, 32, 0.0, 42}; }

struct Batch {
  Tensor x, y;
};
Batch global_batch() {
  Generator g(7);
  return {randint(0, 32, {kRows, kT}, g), randint(0, 32, {kRows, kT}, g)};
}

// The whole model's gradients on the whole batch, by name.
std::map<std::string, Tensor> reference_grads(const nn::GPTConfig& cfg) {
  nn::GPT model(cfg);
  const Batch b = global_batch();
  autograd::backward(nn::cross_entropy_loss(model.forward(b.x), b.y));
  std::map<std::string, Tensor> out;
  for (auto& [name, p] : model.named_parameters()) out[name] = autograd::grad(p);
  return out;
}

// This dp rank's rows as m micro-batches.
std::vector<MicroBatch> my_micro_batches(ProcessGroupManager& pgm, int m) {
  const Batch b = global_batch();
  const int64_t per_rank = kRows / pgm.dp_size, rows = per_rank / m;
  std::vector<MicroBatch> mbs;
  for (int i = 0; i < m; ++i) {
    const int64_t r = pgm.dp_rank * per_rank + i * rows;
    mbs.push_back({ops::contiguous(ops::narrow(b.x, 0, r, rows)), ops::contiguous(ops::narrow(b.y, 0, r, rows))});
  }
  return mbs;
}

double relative_error(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) num += (x[i] - y[i]) * (x[i] - y[i]), den += y[i] * y[i];
  return std::sqrt(num / den);
}

bool same_bits_over(ProcessGroup& group, const Tensor& t) {
  Tensor mine = ops::contiguous(ops::reshape(t, {-1}));
  Tensor all = zeros({group.size() * mine.numel()}, mine.dtype());
  group.all_gather(all, mine);
  const float* p = all.data<float>();
  for (int r = 1; r < group.size(); ++r)
    if (std::memcmp(p, p + r * mine.numel(), size_t(mine.numel()) * sizeof(float)) != 0) return false;
  return true;
}

LossFn model_loss(Model& m) {
  return [&m](const Tensor& logits, const Tensor& y) { return m.chunks->loss(logits, y); };
}

}  // namespace

// pp = world (np 2), and dp 2 x pp 2 with the bucketed main_grad buffer (np 4).
TEST(FinalizeModelGrads, TiedEmbeddingGradientIsTheWholeModelsOnBothStages) {
  const int world = parallel::world().size();
  if (world < 2) GTEST_SKIP() << "needs a pipeline (np 2 and 4)";
  const int dp = world >= 4 ? 2 : 1;
  ProcessGroupManager pgm(dp, world / dp);
  const nn::GPTConfig cfg = config();
  Model m = build_model(cfg, pgm);
  FinalizeModelGrads finalize(m, pgm);
  DataParallelWrap w = wrap_data_parallel(*m.chunks, pgm.dp_group(), {}, finalize.needs_whole_grad());
  forward_backward(m, my_micro_batches(pgm, 2), "1f1b", model_loss(m), w.dp.get());

  auto grad = [&](const Tensor& p) { return w.dp ? w.dp->grad_of(p) : autograd::grad(p); };
  const std::map<std::string, Tensor> want = reference_grads(cfg);
  if (pgm.in_embedding_group()) {
    const Tensor wte = m.chunks->embedding_weight();
    const double before = relative_error(grad(wte), want.at("wte.weight"));
    EXPECT_GT(before, 1e-2) << "each stage holds only its part of the tied gradient before finalize";
  }
  finalize(w.dp.get());
  for (auto& [name, p] : m.chunks->named_parameters())
    EXPECT_LT(relative_error(grad(p), want.at(name)), 1e-5) << name << " on pp rank " << pgm.pp_rank;
  if (pgm.in_embedding_group()) {
    EXPECT_TRUE(same_bits_over(pgm.embedding_group(), grad(m.chunks->embedding_weight())))
        << "both copies take the same step";
  }
}

// Dropping the broadcast passes a training run (both stages build the same
// wte from the same seed); a copy that starts different must not survive it.
TEST(FinalizeModelGrads, TiedEmbeddingCopiesAreMadeEqualAtConstruction) {
  const int world = parallel::world().size();
  if (world < 2) GTEST_SKIP() << "needs a pipeline (np 2 and 4)";
  ProcessGroupManager pgm(1, world);
  Model m = build_model(config(), pgm);
  if (m.chunks->is_last_stage()) {
    NoGradGuard no_grad;
    ops::fill_(m.chunks->embedding_weight(), 0.5);
  }
  FinalizeModelGrads finalize(m, pgm);
  if (pgm.in_embedding_group()) {
    EXPECT_TRUE(same_bits_over(pgm.embedding_group(), m.chunks->embedding_weight()));
    EXPECT_NE(m.chunks->embedding_weight().to_vector<float>()[0], 0.5f) << "the first stage's values win";
  }
}

// tp = world with sequence parallelism (np 2 and 4): each rank's layernorms
// saw T / tp of the tokens; after finalize their gradients are the whole model's.
TEST(FinalizeModelGrads, SequenceParallelLayerNormGradientsAreSummedOverTp) {
  const int world = parallel::world().size();
  if (world < 2) GTEST_SKIP() << "needs tp > 1 (np 2 and 4)";
  ProcessGroupManager pgm(1, 1, world);
  const nn::GPTConfig cfg = config();
  Model m = build_model(cfg, pgm, {"uniform", 1, /*sequence_parallel=*/true});
  FinalizeModelGrads finalize(m, pgm);
  forward_backward(m, my_micro_batches(pgm, 1), "1f1b", model_loss(m), nullptr);
  const std::map<std::string, Tensor> want = reference_grads(cfg);
  const Tensor ln = m.tp->sequence_parallel_partial_params(*m.chunks).front();
  const std::string ln_name = "blocks.0.ln_1.weight";
  Tensor ln_grad_before = ops::clone(autograd::grad(ln));
  finalize(nullptr);
  int checked = 0;
  for (auto& [name, p] : m.tp->replicated_params(*m.chunks)) {
    EXPECT_LT(relative_error(autograd::grad(p), want.at(name)), 1e-5) << name;
    EXPECT_TRUE(same_bits_over(pgm.tp_group(), autograd::grad(p))) << name << ": every tp rank steps the same copy";
    ++checked;
  }
  EXPECT_GT(checked, 5);
  EXPECT_GT(relative_error(ln_grad_before, want.at(ln_name)), 1e-2) << "a partial sum before finalize";
}

TEST(FinalizeModelGrads, NormGroupAndCountedOnceFollowTheGrid) {
  const int world = parallel::world().size();
  const nn::GPTConfig cfg = config();
  {  // Replicas only: each rank's gradients are the whole model's.
    ProcessGroupManager pgm(world, 1);
    Model m = build_model(cfg, pgm);
    FinalizeModelGrads finalize(m, pgm);
    EXPECT_EQ(finalize.grad_stats_group(false), nullptr);
    EXPECT_EQ(finalize.grad_stats_group(true), &pgm.world()) << "ZeRO: every dp shard";
    EXPECT_TRUE(finalize.not_counted().empty());
  }
  if (world < 4) return;
  ProcessGroupManager pgm(1, 2, 2);  // pp 2 x tp 2
  Model m = build_model(cfg, pgm);
  FinalizeModelGrads finalize(m, pgm);
  EXPECT_EQ(finalize.grad_stats_group(false), &pgm.model_parallel_group());
  std::set<const TensorImpl*> left_out;
  for (const Tensor& p : finalize.not_counted()) left_out.insert(p.impl());
  const bool last_copy = m.chunks->is_last_stage();
  EXPECT_EQ(left_out.count(m.chunks->embedding_weight().impl()), last_copy ? 1u : 0u) << "the tied copy once";
  for (auto& [name, p] : m.tp->replicated_params(*m.chunks))
    EXPECT_EQ(left_out.count(p.impl()), pgm.tp_rank == 0 ? 0u : 1u) << name << ": tp replicas once";
}
