// Expert parallelism's second rung on real ranks (CTest runs it on 2 and 4):
// the ep and expert-dp groups are the ranks the grid promises, each rank holds
// E / ep of one process's expert parameters (by global name, so checkpoints and
// exports join them; the planner's plan/moe_model.h counts the same), and
// gathering them gives one process's state back.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "nn/moe.h"
#include "parallel/expert_parallel/expert_parallel.h"
#include "group_members.h"
#include "parallel/process_group_manager.h"
#include "plan/moe_model.h"

using namespace loom;
using namespace loom::parallel;

namespace {

// A 2-layer Llama with E 4 experts of width I 24 over C 16.
nn::GPTConfig moe_config() {
  nn::GPTConfig cfg;
  cfg.set_arch("llama");
  cfg.vocab_size = 11, cfg.block_size = 8, cfg.n_layer = 2, cfg.n_head = 2, cfg.n_embd = 16, cfg.mlp_hidden = 24;
  cfg.moe.experts = 4, cfg.moe.experts_per_token = 2;
  return cfg;
}

int64_t numel_of(const std::vector<Tensor>& ts) {
  int64_t n = 0;
  for (const Tensor& t : ts) n += t.numel();
  return n;
}

}  // namespace

// dp = world, ep 2: ep groups of 2 consecutive ranks, expert-dp groups of the ranks one ep group apart.
TEST(ExpertParallel, EpAndExpertDpGroupsAreTheGridsRanks) {
  const int n = parallel::world().size();
  if (n % 2 != 0) GTEST_SKIP() << "ep 2 needs an even world";
  ProcessGroupManager pgm(n, 1, 1, 1, parallel::world(), 0, /*ep=*/2);
  const int r = pgm.global_rank;
  const Ranks ep = members(pgm.ep_group()), edp = members(pgm.expert_dp_group());
  EXPECT_EQ(ep, (Ranks{r - r % 2, r - r % 2 + 1}));
  Ranks want_edp;
  for (int s = r % 2; s < n; s += 2) want_edp.push_back(s);
  EXPECT_EQ(edp, want_edp);
  EXPECT_EQ(ep, pgm.ranks_along(r, ProcessGrid::kEp));
  EXPECT_EQ(edp, pgm.ranks_along(r, ProcessGrid::kExpertDp | ProcessGrid::kCp));
  EXPECT_EQ(pgm.ep_group().rank(), pgm.ep_rank);
  EXPECT_EQ(pgm.ep_rank, r % 2);
}

// The grad norm's group under ep: one replica's tp x pp ranks with its ep ranks (tests/test_grid.cpp has
// the layouts that are not the world); without tp and pp the ep group itself.
TEST(ExpertParallel, EpModelParallelGroupIsTheGridsRanks) {
  const int n = parallel::world().size();
  if (n != 4) GTEST_SKIP() << "tp 2 x dp 2 needs 4 ranks";
  ProcessGroupManager tp(2, 1, 2, 1, parallel::world(), 0, /*ep=*/2);
  const int r = tp.global_rank;
  EXPECT_EQ(members(tp.ep_model_parallel_group()),
            tp.ranks_along(r, ProcessGrid::kEp | ProcessGrid::kTp | ProcessGrid::kPp));
  EXPECT_EQ(members(tp.ep_model_parallel_group()), (Ranks{0, 1, 2, 3}));
  EXPECT_EQ(members(tp.ep_group()), (Ranks{r % 2, r % 2 + 2}));  // rank = tp_rank + 2 dp_rank
  ProcessGroupManager dp(4, 1, 1, 1, parallel::world(), 0, /*ep=*/2);
  EXPECT_EQ(&dp.ep_model_parallel_group(), &dp.ep_group());
}

// Each rank keeps E / ep experts, experts [r E/ep, (r+1) E/ep) under their global names: the expert
// parameters it holds are 1/ep of one process's, everything else whole.
TEST(ExpertParallel, EachRankHoldsEOverEpOfTheExpertParams) {
  const int n = parallel::world().size();
  if (n != 2 && n != 4) GTEST_SKIP() << "ep 2 or 4 divides E 4";
  ProcessGroupManager pgm(n, 1, 1, 1, parallel::world(), 0, /*ep=*/n);
  nn::GPT one(moe_config()), split(moe_config());
  use_expert_parallel(split, pgm.ep_group());
  const int64_t C = 16, I = 24, L = 4 / n, layers = 2;
  const int64_t one_experts = numel_of(expert_params(one)), held = numel_of(expert_params(split));
  EXPECT_EQ(one_experts, layers * 4 * 3 * C * I);
  EXPECT_EQ(held, layers * L * 3 * C * I);
  EXPECT_EQ(held * n, one_experts);
  EXPECT_EQ(split.num_parameters(), one.num_parameters() - one_experts + held);  // the rest whole
  // By global name, with one process's values (the same seed drew every expert before the others went).
  std::map<std::string, Tensor> one_state;
  for (const auto& [name, t] : one.state_dict()) one_state[name] = t;
  int64_t experts_seen = 0;
  for (const auto& [name, t] : split.state_dict()) {
    ASSERT_TRUE(one_state.count(name)) << name;
    EXPECT_EQ(t.to_vector<float>(), one_state.at(name).to_vector<float>()) << name;
    const size_t at = name.find(".experts.");
    if (at == std::string::npos) continue;
    const int64_t e = std::stoll(name.substr(at + 9));
    EXPECT_GE(e, pgm.ep_rank * L) << name;
    EXPECT_LT(e, (pgm.ep_rank + 1) * L) << name;
    ++experts_seen;
  }
  EXPECT_EQ(experts_seen, layers * L * 3);
  // The planner's count (plan/moe_model.h, loom_plan --ep) of a MoE block's MLP part on this rank:
  // the router [E, C] and E / ep experts - what the rank holds.
  plan::ModelShape shape;
  shape.layers = layers, shape.width = C, shape.heads = 2, shape.vocab = 11, shape.seq = 8, shape.llama = true;
  shape.experts = 4, shape.experts_per_token = 2, shape.expert_ffn = I;
  plan::Grid grid;
  grid.dp = n, grid.ep = n;
  const std::vector<nn::MoE*> moe = nn::moe_layers(split);
  ASSERT_EQ(moe.size(), size_t(layers));
  for (int64_t b = 0; b < layers; ++b) {
    EXPECT_EQ(numel_of(moe[size_t(b)]->experts->parameters()), plan::expert_params(shape, grid, b)) << "block " << b;
    EXPECT_EQ(moe[size_t(b)]->num_parameters(), plan::mlp_params(shape, grid, b)) << "block " << b;
  }
}

// gather_experts puts every rank's experts back: one process's state, in its order.
TEST(ExpertParallel, GatherExpertsGivesOneProcesssState) {
  const int n = parallel::world().size();
  if (n != 2 && n != 4) GTEST_SKIP() << "ep 2 or 4 divides E 4";
  ProcessGroupManager pgm(n, 1, 1, 1, parallel::world(), 0, /*ep=*/n);
  nn::GPT one(moe_config()), split(moe_config());
  use_expert_parallel(split, pgm.ep_group());
  const nn::NamedTensors want = one.state_dict(), got = gather_experts(split, split.state_dict(), pgm.ep_group());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first) << i;
    EXPECT_EQ(got[i].second.to_vector<float>(), want[i].second.to_vector<float>()) << want[i].first;
  }
}
