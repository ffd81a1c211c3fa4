// FullyShardedDataParallel (ZeRO-3)'s schedule of gathers and frees, checked
// through the params' storages and the allocator, run by CTest on 2 ranks.
// Its numbers (losses and weights equal to one process) are checked end to
// end in tests/test_train_gpt_parallel.cpp; here, what makes it ZeRO-3:
//   - in forward, layer l computes with exactly the units it reads and the
//     next layer's (prefetched) materialized - at most two units (three where
//     the head reads the tied embedding's) - and the live bytes say the same;
//   - after backward no full param and no full gradient is left, and each
//     rank's fp32 grad shard holds the dp average of its part;
//   - the shards are 1/dp of each unit, padded.
// The GPT: 2 blocks, C 32; layers 0 (embedding: wte, wpe), 1, 2 (blocks), 3
// (head: ln_f, and wte, which is unit 0's).
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/variable.h"
#include "parallel/comm/distributed.h"
#include "parallel/data_parallel/fully_sharded.h"
#include "parallel/model_chunks.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"
#include "tensor/storage.h"

using namespace loom;
using loom::parallel::FullyShardedDataParallel;
using loom::parallel::ModelChunks;

namespace {

nn::GPTConfig tiny_gpt() {
  nn::GPTConfig cfg;
  cfg.vocab_size = 40, cfg.block_size = 16, cfg.n_layer = 2, cfg.n_head = 2, cfg.n_embd = 32;
  return cfg;
}

// The units layer l reads: its own; the head also the embedding's (tied wte).
std::set<size_t> reads(size_t l, size_t num_layers) {
  if (l + 1 == num_layers) return {0, l};
  return {l};
}

std::set<size_t> materialized(const FullyShardedDataParallel& fsdp) {
  std::set<size_t> out;
  for (size_t u = 0; u < fsdp.units().size(); ++u)
    if (fsdp.units()[u].full.defined() && fsdp.units()[u].full.storage()->is_allocated()) out.insert(u);
  return out;
}

int64_t bytes_of(const FullyShardedDataParallel& fsdp, const std::set<size_t>& units) {
  int64_t b = 0;
  for (size_t u : units) b += int64_t(fsdp.units()[u].full.nbytes());
  return b;
}

}  // namespace

TEST(FullyShardedDataParallel, ShardsAreOneDpthOfEachUnitPaddedAndTheFullParamsAreFreed) {
  parallel::ProcessGroup& world = parallel::world();
  nn::GPTConfig cfg = tiny_gpt();
  ModelChunks model(cfg, parallel::LayerRange{0, cfg.num_layers()});
  const int64_t live_before = memory_stats().live_bytes;
  FullyShardedDataParallel fsdp(model.layers(), world);
  ASSERT_EQ(fsdp.units().size(), 4u);
  // embedding: wte 40x32 + wpe 16x32; block: 12 C^2 + 13 C; head: ln_f only (wte is unit 0's)
  const std::vector<int64_t> numel = {40 * 32 + 16 * 32, 12 * 32 * 32 + 13 * 32, 12 * 32 * 32 + 13 * 32, 2 * 32};
  int64_t shard_bytes = 0;
  for (size_t u = 0; u < 4; ++u) {
    const auto& unit = fsdp.units()[u];
    EXPECT_EQ(unit.numel, numel[u]) << "unit " << u;
    const int64_t padded = (numel[u] + world.size() - 1) / world.size() * world.size();
    EXPECT_EQ(unit.full.numel(), padded);
    EXPECT_EQ(unit.shard.numel(), padded / world.size());
    EXPECT_EQ(unit.grad_shard.numel(), padded / world.size());
    EXPECT_FALSE(unit.full.storage()->is_allocated()) << "unit " << u << " is gathered outside forward";
    shard_bytes += 4 * unit.shard.numel() * 2;  // fp32 shard + fp32 grad shard
  }
  EXPECT_EQ(fsdp.gathered_bytes(), 0);
  // What the model holds now: the shards, nothing of the full params (which it was built with).
  EXPECT_EQ(memory_stats().live_bytes - live_before + 4 * model.num_parameters(), shard_bytes);
}

TEST(FullyShardedDataParallel, ForwardHoldsTheComputingAndThePrefetchedUnitOnly) {
  parallel::ProcessGroup& world = parallel::world();
  nn::GPTConfig cfg = tiny_gpt();
  ModelChunks model(cfg, parallel::LayerRange{0, cfg.num_layers()});
  FullyShardedDataParallel fsdp(model.layers(), world);
  const size_t n = model.layers().size();
  Generator gen(11 + uint64_t(world.rank()));
  Tensor ids = randint(0, cfg.vocab_size, {2, 16}, gen), targets = randint(0, cfg.vocab_size, {2, 16}, gen);

  // Hooks registered after the wrapper's run after its: they see what it left.
  std::vector<std::set<size_t>> while_computing(n), after(n), before_backward(n);
  std::vector<int64_t> live_while_computing(n), input_bytes(n);
  std::vector<autograd::RemovableHandle> hooks;
  for (size_t l = 0; l < n; ++l) {
    hooks.push_back(model.layers()[l]->register_forward_pre_hook([&, l](nn::Module&, const Tensor& x) {
      while_computing[l] = materialized(fsdp);
      live_while_computing[l] = memory_stats().live_bytes;
      input_bytes[l] = int64_t(x.nbytes());
    }));
    // In backward a probe on the output runs just before the wrapper's own
    // identity of layer l (which gathers l): what the layers after l left.
    hooks.push_back(model.layers()[l]->register_forward_hook([&, l](nn::Module&, const Tensor&, Tensor& out) {
      after[l] = materialized(fsdp);
      out = autograd::record("Probe", {&out}, out, [&, l](const autograd::TensorList& g) {
        before_backward[l] = materialized(fsdp);
        return g;
      });
    }));
  }

  // 1. Training forward: layer l computes with its units and the next layer's
  //    prefetched; after it only the prefetched remain (the last layer keeps
  //    its own: its backward comes next).
  Tensor loss = model.loss(model.forward(ids), targets);
  for (size_t l = 0; l < n; ++l) {
    std::set<size_t> expected = reads(l, n);
    if (l + 1 < n)
      for (size_t u : reads(l + 1, n)) expected.insert(u);
    EXPECT_EQ(while_computing[l], expected) << "materialized while layer " << l << " computes";
    EXPECT_EQ(after[l], l + 1 < n ? reads(l + 1, n) : reads(l, n)) << "materialized after layer " << l;
  }
  // At most two units at once, three where the head reads the tied embedding's.
  EXPECT_LE(while_computing[1].size(), 2u);
  EXPECT_LE(while_computing[n - 2].size(), 3u);

  // 2. Backward: before layer l's backward, l is there already (prefetched by
  //    l+1's), l+1 is gone (freed when its last gradient was reduce-scattered),
  //    and the embedding unit stays until its wte gradient is whole, at the end.
  //    Then no full param, no .grad is left; the grad shards are filled.
  autograd::backward(loss);
  for (size_t l = 0; l < n; ++l)
    EXPECT_EQ(before_backward[l], (std::set<size_t>{0, l})) << "materialized before layer " << l << "'s backward";
  EXPECT_TRUE(materialized(fsdp).empty());
  for (const auto& unit : fsdp.units()) {
    for (const Tensor& p : unit.params) EXPECT_FALSE(autograd::grad(p).defined()) << p.describe();
    EXPECT_GT(ops::sum(ops::mul(unit.grad_shard, unit.grad_shard)).item<double>(), 0);
  }

  // 3. The live bytes: an eval forward frees each layer's activations as it
  //    goes, so while layer l computes what is live beyond the start is its
  //    input and the gathered units, to the byte.
  {
    NoGradGuard no_grad;
    const int64_t start = memory_stats().live_bytes;
    model.forward(ids);
    for (size_t l = 0; l < n; ++l) {
      std::set<size_t> expected = reads(l, n);
      if (l + 1 < n)
        for (size_t u : reads(l + 1, n)) expected.insert(u);
      EXPECT_EQ(while_computing[l], expected) << "eval, layer " << l;
      const int64_t activation = l == 0 ? 0 : input_bytes[l];  // the token ids were live before
      EXPECT_EQ(live_while_computing[l] - start, bytes_of(fsdp, expected) + activation) << "live bytes, layer " << l;
    }
    EXPECT_TRUE(materialized(fsdp).empty()) << "an eval forward frees every unit, the last too";
  }
}

// The reduce-scattered gradient against the whole one: rank r's shard of each
// unit is the dp average of the ranks' full gradients over r's elements.
TEST(FullyShardedDataParallel, GradShardIsTheDpAverageOfThisRanksPart) {
  parallel::ProcessGroup& world = parallel::world();
  nn::GPTConfig cfg = tiny_gpt();
  ModelChunks reference(cfg, parallel::LayerRange{0, cfg.num_layers()});
  ModelChunks model(cfg, parallel::LayerRange{0, cfg.num_layers()});
  FullyShardedDataParallel fsdp(model.layers(), world);
  Generator gen(5 + uint64_t(world.rank()));
  Tensor ids = randint(0, cfg.vocab_size, {2, 16}, gen), targets = randint(0, cfg.vocab_size, {2, 16}, gen);
  autograd::backward(reference.loss(reference.forward(ids), targets));
  autograd::backward(model.loss(model.forward(ids), targets));
  fsdp.finish_grad_sync();
  std::vector<Tensor> ref_params = reference.parameters();
  std::vector<Tensor> fsdp_params = model.parameters();
  ASSERT_EQ(ref_params.size(), fsdp_params.size());
  size_t k = 0;
  for (const auto& unit : fsdp.units()) {
    // The reference's gradient of this unit, flattened like its buffer, averaged over dp.
    Tensor flat = zeros({unit.full.numel()});
    for (size_t i = 0; i < unit.params.size(); ++i, ++k) {
      ASSERT_TRUE(unit.params[i].is_same(fsdp_params[k]));
      ops::copy_(ops::narrow(flat, 0, unit.offsets[i], unit.params[i].numel()),
                 ops::reshape(autograd::grad(ref_params[k]), {-1}));
    }
    world.all_reduce(flat, parallel::ReduceOp::Avg);
    const int64_t s = unit.shard.numel();
    std::vector<float> want = ops::narrow(flat, 0, world.rank() * s, s).to_vector<float>();
    std::vector<float> got = unit.grad_shard.to_vector<float>();
    for (int64_t i = 0; i < s; ++i) EXPECT_NEAR(got[size_t(i)], want[size_t(i)], 1e-6 + 1e-5 * std::abs(want[size_t(i)]));
  }
}
