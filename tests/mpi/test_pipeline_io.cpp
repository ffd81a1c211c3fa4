// A pipeline's stages as one model (CTest runs it on 1, 2 and 4 ranks, pp =
// world): the validation loss of eval_step_pipeline against the single-process
// GPT on the same micro-batches, and gather_stage_states / load_stage_state
// against the full GPT's state dict. Every rank builds the full model too (the
// reference: cheap at this size). A 4-block GPT is 6 layers, cut by
// partition_balanced (uniform would not divide them over 4 stages).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "autograd/variable.h"
#include "nn/gpt.h"
#include "nn/loss.h"
#include "parallel/comm/distributed.h"
#include "parallel/pipeline_parallel/gather_model.h"
#include "parallel/pipeline_parallel/pipeline_schedule.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"
#include "tests/error_of.h"

using namespace loom;
using namespace loom::parallel;

namespace {

constexpr int64_t kT = 16, kV = 32, kRowsPerMicroBatch = 2;

// V 32, block 16, 4 blocks, 2 heads, C 32; dropout on, to show that eval mode turns it off.
nn::GPTConfig config(uint64_t seed = 42) { return {kV, kT, 4, 2, 32, 0.1, seed}; }

LayerRange my_range(const nn::GPTConfig& cfg) {
  ProcessGroup& world = parallel::world();
  return partition_balanced(gpt_layer_param_counts(cfg), world.size())[size_t(world.rank())][0];
}

// Same bytes, same dtype, same shape.
bool bit_identical(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  Tensor ca = ops::contiguous(a), cb = ops::contiguous(b);
  return std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

// Rank 0's dict on every rank: the other ranks receive into tensors shaped
// like `like` (the full GPT's state dict: the same names, shapes, dtypes).
nn::NamedTensors broadcast_from_rank0(const nn::NamedTensors& on_rank0, const nn::NamedTensors& like) {
  ProcessGroup& world = parallel::world();
  nn::NamedTensors out;
  for (size_t i = 0; i < like.size(); ++i) {
    Tensor t = world.rank() == 0 ? ops::clone(on_rank0.at(i).second) : empty_like(like[i].second);
    world.broadcast(t, 0);
    out.emplace_back(like[i].first, t);
  }
  return out;
}

}  // namespace

// ---- the validation loss -------------------------------------------------------------

TEST(PipelineIO, EvalStepMatchesTheSingleProcessLossAndLeavesNoAutogradState) {
  ProcessGroup& world = parallel::world();
  nn::GPTConfig cfg = config();
  // The reference and the stage start from different seeds: load_stage_state
  // is what makes their weights equal.
  nn::GPT model(cfg);
  ModelChunks stage(config(7), my_range(cfg));
  load_stage_state(stage, model.state_dict());
  model.eval();
  stage.eval();

  Generator g(123);
  std::vector<MicroBatch> mbs;
  for (int i = 0; i < 3; ++i)
    mbs.push_back({randint(0, kV, {kRowsPerMicroBatch, kT}, g), randint(0, kV, {kRowsPerMicroBatch, kT}, g)});
  double want = 0;
  {
    NoGradGuard no_grad;
    for (const MicroBatch& mb : mbs) want += nn::cross_entropy_loss(model.forward(mb.x), mb.y).item<double>();
    want /= double(mbs.size());
  }

  PipelineP2P p2p(world);
  int graphs_recorded = 0;  // logits that reach the loss (last stage) with a grad_fn
  LossFn loss_fn = [&](const Tensor& logits, const Tensor& y) {
    if (autograd::grad_fn(logits)) ++graphs_recorded;
    return nn::cross_entropy_loss(logits, y);
  };
  const int64_t live_before = memory_stats().live_bytes;
  const double got = eval_step_pipeline(stage, p2p, mbs, loss_fn);
  const int64_t live_after = memory_stats().live_bytes;

  EXPECT_NEAR(got, want, 1e-6 * want) << "every stage returns the last stage's mean loss";
  EXPECT_EQ(graphs_recorded, 0) << "the forwards ran under NoGradGuard";
  EXPECT_TRUE(GradMode::is_enabled()) << "and grad mode is back on afterwards";
  EXPECT_EQ(live_after, live_before) << "no activation outlives the step";
  for (const auto& [name, p] : stage.named_parameters()) EXPECT_FALSE(autograd::grad(p).defined()) << name;
}

// ---- gathering the stages into one model, and back -------------------------------------

TEST(PipelineIO, GatherGivesRankZeroTheFullModelsStateDictInEveryDtype) {
  ProcessGroup& world = parallel::world();
  for (DType dtype : {kFloat32, kBFloat16, kFloat16}) {
    SCOPED_TRACE(dtype_name(dtype));
    // A stage draws exactly the full model's weights from the same seed (nn/gpt.h).
    nn::GPT model(config());
    ModelChunks stage(config(), my_range(config()));
    model.to(dtype);
    stage.to(dtype);

    nn::NamedTensors got = gather_stage_states(stage, world);
    if (world.rank() != 0) {
      EXPECT_TRUE(got.empty());
      continue;
    }
    nn::NamedTensors want = model.state_dict();
    EXPECT_EQ(got.size(), want.size());  // (no ASSERT: the next dtype's gather is a collective)
    for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
      EXPECT_EQ(got[i].first, want[i].first) << "entry " << i;
      EXPECT_TRUE(bit_identical(got[i].second, want[i].second)) << want[i].first;
    }
    // A snapshot: rank 0's own entries are copies, not its parameters.
    EXPECT_NE(got[0].second.storage().get(), stage.embedding_weight().storage().get());
  }
}

TEST(PipelineIO, GatherLoadGatherRoundTripIsIdentical) {
  ProcessGroup& world = parallel::world();
  for (DType dtype : {kFloat32, kBFloat16}) {
    SCOPED_TRACE(dtype_name(dtype));
    ModelChunks stage(config(), my_range(config()));
    stage.to(dtype);
    nn::NamedTensors first = gather_stage_states(stage, world);

    // Fresh stages with other weights take the gathered state (every rank
    // needs it: broadcast, as every rank would read it from a checkpoint).
    nn::GPT like(config());
    like.to(dtype);
    nn::NamedTensors full = broadcast_from_rank0(first, like.state_dict());
    ModelChunks fresh(config(99), my_range(config()));
    fresh.to(dtype);
    load_stage_state(fresh, full);
    nn::NamedTensors second = gather_stage_states(fresh, world);

    if (world.rank() == 0) {
      EXPECT_EQ(second.size(), first.size());
      for (size_t i = 0; i < std::min(first.size(), second.size()); ++i) {
        EXPECT_EQ(second[i].first, first[i].first);
        EXPECT_TRUE(bit_identical(second[i].second, first[i].second)) << first[i].first;
      }
    }
    // The last stage's copy of wte, never gathered, was loaded from wte.weight.
    if (fresh.is_last_stage()) {
      EXPECT_TRUE(bit_identical(fresh.embedding_weight(), full.front().second)) << "the head's wte copy";
    }
  }
}

TEST(PipelineIO, LoadStageStateNamesTheEntryItLacks) {
  nn::GPT model(config());
  ModelChunks stage(config(7), my_range(config()));
  // Drop this stage's last parameter (wte.weight on the last stage: its copy
  // comes from that entry) from the full state.
  const std::string dropped = stage.named_parameters().back().first;
  nn::NamedTensors full;
  for (auto& [name, t] : model.state_dict())
    if (name != dropped) full.emplace_back(name, t);
  const std::string msg = test::error_of([&] { load_stage_state(stage, full); });
  EXPECT_NE(msg.find("load_stage_state"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no entry " + dropped), std::string::npos) << msg;
}

// With chunks (interleaved 1F1B) a rank's layers are not contiguous - rank 0
// of pp 2 x v 3 over 6 layers holds layers 0, 2 and 4 - yet rank 0 still gets
// the full model's entries in the full model's order.
TEST(PipelineIO, GatherWithChunksGivesTheFullModelInItsOrder) {
  ProcessGroup& world = parallel::world();
  if (world.size() != 2) GTEST_SKIP() << "pp 2 x v 2 and v 3 over 6 layers";
  for (int v : {2, 3}) {
    SCOPED_TRACE(str("v ", v));
    nn::GPT model(config());
    ModelChunks stage(config(), partition_uniform(config().num_layers(), 2, v)[size_t(world.rank())]);
    nn::NamedTensors got = gather_stage_states(stage, world);
    if (world.rank() != 0) continue;
    nn::NamedTensors want = model.state_dict();
    EXPECT_EQ(got.size(), want.size());
    for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
      EXPECT_EQ(got[i].first, want[i].first) << "entry " << i;
      EXPECT_TRUE(bit_identical(got[i].second, want[i].second)) << want[i].first;
    }
  }
}

// Evaluation goes round the ring v times per micro-batch: the same loss as one process.
TEST(PipelineIO, EvalStepWithChunksMatchesTheSingleProcessLoss) {
  ProcessGroup& world = parallel::world();
  if (world.size() != 2) GTEST_SKIP() << "pp 2 x v 3 over 6 layers";
  nn::GPT model(config());
  ModelChunks stage(config(), partition_uniform(config().num_layers(), 2, 3)[size_t(world.rank())]);
  model.eval();
  stage.eval();
  Generator g(5);
  std::vector<MicroBatch> mbs;
  for (int i = 0; i < 3; ++i)
    mbs.push_back({randint(0, kV, {kRowsPerMicroBatch, kT}, g), randint(0, kV, {kRowsPerMicroBatch, kT}, g)});
  double want = 0;
  {
    NoGradGuard no_grad;
    for (const MicroBatch& mb : mbs) want += nn::cross_entropy_loss(model.forward(mb.x), mb.y).item<double>();
    want /= double(mbs.size());
  }
  PipelineP2P p2p(world);
  const double got = eval_step_pipeline(stage, p2p, mbs, [](const Tensor& logits, const Tensor& y) {
    return nn::cross_entropy_loss(logits, y);
  });
  EXPECT_NEAR(got, want, 1e-6 * want);
}

// ---- what a stage receives ----------------------------------------------------------

// A stage that receives an activation of the wrong shape (a neighbour started
// with another --embd) stops with a message naming the stage, the micro-batch
// and both shapes, instead of failing inside a matmul. Stage 0 sends the
// impostor by hand (and so waits for no gradient); stage 1 runs the schedule.
TEST(PipelineReceive, AnActivationOfTheWrongShapeIsNamed) {
  ProcessGroup& world = parallel::world();
  if (world.size() != 2) GTEST_SKIP() << "a two-stage exchange";
  nn::GPTConfig cfg = config();
  PipelineP2P p2p(world);
  if (world.rank() == 0) {
    p2p.send_forward(zeros({kRowsPerMicroBatch, kT, 48}), 0);  // C 48, not 32
    return;
  }
  ModelChunks stage(cfg, partition_uniform(cfg.num_layers(), 2)[1][0]);
  std::vector<MicroBatch> mbs{{zeros({kRowsPerMicroBatch, kT}, kInt64), zeros({kRowsPerMicroBatch, kT}, kInt64)}};
  std::string err = test::error_of([&] {
    train_step_pipeline_afab(stage, p2p, mbs, [](const Tensor& l, const Tensor& y) { return nn::cross_entropy_loss(l, y); });
  });
  EXPECT_NE(err.find("pipeline: stage 1 received [2, 16, 48] float32 as the activation of micro-batch 0, expected "
                     "shape [2, 16, 32]"),
            std::string::npos)
      << err;
}
