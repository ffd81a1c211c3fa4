// --memory-report's activation ledger under the zero-bubble schedules (issue
// 46): the split backward's term, what a micro-batch holds from its B to its
// W (optim/split_backward.h), walked through the stage's order
// (predict_activations_interleaved). Measured = formula to the byte, but the
// loss's fp32 scalars (4-12 bytes), on every stage.
// Without the term the last stage measured 1.04 MiB against 0.85 (the
// default model, pp 4, m 4, b 2): each deferred W kept its X and dY, which
// the count of 1F1B's micro-batches did not have. At the end, a mixture of
// experts under the same schedules (issue 45).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "optim/activation_memory.h"
#include "optim/pipeline_activations.h"
#include "optim/moe_activations.h"
#include "optim/split_backward.h"
#include "tests/memory_ledger_moe.h"

using namespace loom;
using namespace loom::test;

TEST(SplitBackwardFormula, HoldsEachLinearsXAndDYUntilW) {
  // b 2, s 4, h 8, a 2, V 10, fp32, one block and the head on a later
  // pipeline stage: a [b, s, h] unit is 256 bytes. Held until W: the block's
  // X (ln_1's and ln_2's outputs, the merged heads 1 unit each, gelu's 4) and
  // dY (c_attn's 3, attn.c_proj's 1, c_fc's 4, mlp.c_proj's 1): 16 units;
  // ln_1's and ln_2's weight and bias gradients [8] fp32, 128; the head's X
  // 256, its dY [8, 10] fp32 320 and ln_f's gradients 64; the stage's input
  // and its gradient, 512.
  optim::ActivationCase c;
  c.micro_batch = 2, c.seq = 4, c.width = 8, c.heads = 2, c.vocab = 10, c.blocks = 1, c.has_head = true;
  c.pp_stage = true, c.batch_tokens = 8;
  EXPECT_DOUBLE_EQ(optim::predict_activations(c).held_until_w, 16 * 256 + 128 + 256 + 320 + 64 + 512);
  // The head alone: B's peak is ln_f's backward. Above what is kept, the
  // logits 320 and their log-sum-exp 32 are freed; alive are their gradient
  // 320 (the head's dY), ln_f's incoming gradient 256, its dx 256 and
  // gradients 64. W's first dW (the head's [10, 8]) 320.
  c.blocks = 0;
  const optim::ActivationPrediction head = optim::predict_activations(c);
  EXPECT_DOUBLE_EQ(head.split_extra, -320 - 32 + 320 + 256 + 256 + 64);
  EXPECT_DOUBLE_EQ(head.w_extra, 320);
  EXPECT_DOUBLE_EQ(head.held_until_w, 256 + 320 + 64 + 512);
}

// ZeRO-3 (optim/zero3_activations.h's zero3_in_b): B reshards nothing, so a stage of the head alone (--pp 2
// --layers 1) holds the head's units (ln_f's, the tied wte copy's) through B's head moments: measured =
// formula with them, 2760 bytes (1.9%) under it without (bf16, m 4). The ledger below runs no such stage, so
// the count itself: with H bytes of head units, B's peak rises by H whichever head moment it is, the head
// linear's B (V 10) or, with a vocabulary large enough, the loss's gradient of the logits (V 1000).
TEST(SplitBackwardFormula, Zero3HoldsTheHeadsUnitsThroughB) {
  for (int64_t vocab : {10, 1000}) {
    optim::ActivationCase c;
    c.micro_batch = 2, c.seq = 4, c.width = 8, c.heads = 2, c.vocab = vocab, c.blocks = 0, c.has_head = true;
    c.pp_stage = true, c.batch_tokens = 8;
    const double without = optim::predict_activations(c).split_extra, H = 1e6;
    c.zero3.on = true, c.zero3.head = H;
    EXPECT_DOUBLE_EQ(optim::predict_activations(c).split_extra, without + H) << "V " << vocab;
  }
}

namespace {

struct ZbRun {
  const char* name;
  int ranks;
  const char* args;
};

void PrintTo(const ZbRun& r, std::ostream* os) { *os << r.name << ": " << r.args; }

class ZeroBubbleLedger : public ::testing::TestWithParam<ZbRun> {};

}  // namespace

TEST_P(ZeroBubbleLedger, MeasuredEqualsTheFormulaOnEveryStage) {
  const ZbRun& run = GetParam();
  const fs::path json_path = work_dir() / (std::string(run.name) + "_memory.json");
  Result r = train(run.name, run.ranks, std::string(run.args) + " --steps 2 --memory-json " + json_path.string(),
                   /*save=*/false);
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream f(json_path);
  ASSERT_TRUE(f.good()) << json_path;
  const nlohmann::json ledger = nlohmann::json::parse(f);
  ASSERT_EQ(ledger["ranks"].size(), size_t(run.ranks));
  for (const auto& rank : ledger["ranks"]) {
    const double measured = rank["activations"]["measured"].get<double>();
    const double formula = rank["activations"]["predicted"].get<double>();
    std::printf("[ measured ] %-12s rank %d: activations %.0f bytes, formula %.0f (%+.0f)\n", run.name,
                rank["rank"].get<int>(), measured, formula, measured - formula);
    // + the loss's scalars, 4-12 bytes: nothing else. Each send is let go of
    // at a point of the schedule's order (send_release.h), which the formula
    // counts; before, a gradient whose isend had not completed at the peak
    // (timing: measured either way in repeated runs) and its 80-byte header.
    EXPECT_GE(measured, formula) << run.name << " rank " << rank["rank"];
    EXPECT_LE(measured, formula + 16) << run.name << " rank " << rank["rank"];
    // comm: the buckets' padding, or ZeRO-3's gathered working set, which under ZB-H1 is every unit of the stage
    // (B reshards none: optim/memory_report.h; the 1F1B count was 35% under on the head's stage)
    EXPECT_EQ(rank["comm"]["measured"].get<int64_t>(), rank["comm"]["predicted"].get<int64_t>())
        << run.name << " rank " << rank["rank"];
  }
}

// The test's small model (2 blocks, h 32, s 16): pp 2 puts the embedding and
// a block on stage 0, a block and the head on stage 1; pp 3 a stage of the
// head alone, whose peak is W's first dW at m 4 (its four W's wait).
INSTANTIATE_TEST_SUITE_P(
    ZBH1, ZeroBubbleLedger,
    ::testing::Values(ZbRun{"zbh1_pp2_m4_b2", 2, "--pp 2 --schedule zb-h1 --microbatches 4 --batch 2"},
                      ZbRun{"zbh1_pp2_m8_b4", 2, "--pp 2 --schedule zb-h1 --microbatches 8 --batch 4"},
                      ZbRun{"zbh1_pp3_m4_b2", 3, "--pp 3 --schedule zb-h1 --microbatches 4 --batch 2"},
                      // Llama's blocks: SwiGLU's product (c_proj's X) held through its backward's moment
                      ZbRun{"zbh1_llama_pp2", 2, "--arch llama --pp 2 --schedule zb-h1 --microbatches 4 --batch 2"},
                      // ZeRO-3 (optim/zero3_activations.h's zero3_in_b): B reshards nothing, so each stage's
                      // units gathered so far stand beside B's moments; with 3 blocks a stage its first blocks'
                      // moments peak (bf16: without the units the formula was 7.4% above stage 0 at m 4,
                      // --layers 4; without the earlier blocks 1.5% below it here)
                      ZbRun{"zbh1_dp2_pp2_bf16_zero3", 4,
                            "--dp 2 --pp 2 --schedule zb-h1 --microbatches 4 --batch 8 --zero 3 --layers 6 "
                            "--dtype bf16"}),
    [](const auto& info) { return std::string(info.param.name); });

// The V (zb-v, dualpipev). Stage 0 holds both ends, and the tied wte is one
// tensor there: one .grad, not one per chunk (train/diagnostics.cpp; the
// formula counted it twice once both chunks' W had run, 8320 bytes, and put
// the peak where it was not: measured 6004 bytes below it at pp 2). Each send
// is let go of at the first op that knows it arrived (send_release.h): an
// input gradient may outlive its W until then, and the first send on each
// link holds an 80-byte header as long. Without that term stage 0 measured
// one gradient above the formula (+8200 bytes at zb-v pp 2, b 4: B1.1's,
// alive through W1.1 and B2.1's peak), and a stage 1 one header (+80).
INSTANTIATE_TEST_SUITE_P(
    V, ZeroBubbleLedger,
    ::testing::Values(ZbRun{"zbv_pp2_m4_b4", 2, "--pp 2 --virtual-stages 2 --schedule zb-v --microbatches 4 --batch 4"},
                      ZbRun{"dpv_pp2_m4_b4", 2, "--pp 2 --virtual-stages 2 --schedule dualpipev --microbatches 4 --batch 4"},
                      ZbRun{"zbv_pp2_bf16", 2, "--pp 2 --virtual-stages 2 --schedule zb-v --microbatches 4 --batch 4 --dtype bf16"},
                      ZbRun{"dpv_pp2_bf16", 2, "--pp 2 --virtual-stages 2 --schedule dualpipev --microbatches 4 --batch 4 --dtype bf16"},
                      ZbRun{"zbv_pp3_m6_b2", 3, "--pp 3 --layers 4 --virtual-stages 2 --schedule zb-v --microbatches 6 --batch 2"},
                      ZbRun{"dpv_pp3_m6_b2", 3, "--pp 3 --layers 4 --virtual-stages 2 --schedule dualpipev --microbatches 6 --batch 2"},
                      ZbRun{"zbv_pp3_bf16", 3, "--pp 3 --layers 4 --virtual-stages 2 --schedule zb-v --microbatches 6 --batch 2 --dtype bf16"},
                      ZbRun{"dpv_pp3_bf16", 3, "--pp 3 --layers 4 --virtual-stages 2 --schedule dualpipev --microbatches 6 --batch 2 --dtype bf16"},
                      ZbRun{"zbv_pp4_m8_b2", 4, "--pp 4 --layers 6 --virtual-stages 2 --schedule zb-v --microbatches 8 --batch 2"},
                      ZbRun{"dpv_pp4_m8_b2", 4, "--pp 4 --layers 6 --virtual-stages 2 --schedule dualpipev --microbatches 8 --batch 2"}),
    [](const auto& info) { return std::string(info.param.name); });

// A mixture of experts (nn/moe.h, optim/moe_activations.h's split table; the ledger of tests/memory_ledger_moe.h).
// The zero-bubble schedules (B and W apart, optim/split_backward.h): N = 4 x 32 = 128 tokens, k 2, M = 256 rows, E 4,
// I 88, C 64, fp32. Held by the MoE block's linears from B to W (optim/moe_activations.h's split table): the gate's dY
// [128, 4] 2048; the experts' rows [256, 64] (w1's and w3's X), their output gradient [257, 64] (w2's dY, unpermute's
// zero row too), w1's and w3's dY and w2's X [256, 88] each: 4 x (16384 + 16448 + 3 x 22528) = 401,664.
TEST(MoEActivations, SplitBackwardHoldsTheExpertsXAndDYUntilW) {
  optim::ActivationCase c;
  c.micro_batch = 4, c.seq = 32, c.width = 64, c.mlp_hidden = 88, c.element_bytes = 4;
  c.moe_experts = 4, c.moe_experts_per_token = 2;
  EXPECT_DOUBLE_EQ(optim::moe_held_until_w(c), 2048 + 401664);
  // B's (X) walk over the groups [70, 60, 66, 60], the last expert first. Its base: unpermute's backward has freed
  // 4 x (257 x 64 + 256 x 64) + 8 x 256, and the output gradient [257, 64] stays (w2's dY): -67,584. Expert 3 at its
  // product's backward: w2's dx and the product's two gradients, the product held, 3 x 4 x 60 x 88 = 63,360: -4,224.
  // The later ones lose 4 x 88 x M_j per expert done and gain the summed input gradient [256, 64]: less. So (M), the
  // weighting's backward 2 x 4 x 256 x 64 + 12 x 256 = 134,144, is B's MoE peak.
  c.moe_local_groups = {70, 60, 66, 60};
  EXPECT_DOUBLE_EQ(optim::moe_split_backward_bytes(c), 134144);
  // I 512: expert 3's moment, -67,584 + 3 x 4 x 60 x 512 = 301,056; then expert 2 (66 rows) after expert 3 freed
  // 4 x 60 x 512: -67,584 - 122,880 + 65,536 + 405,504 = 280,576, and so on down.
  c.mlp_hidden = 512;
  EXPECT_DOUBLE_EQ(optim::moe_split_backward_bytes(c), 301056);
  // Backward takes expert 0 first if it comes last: 70 rows, -67,584 + 3 x 4 x 70 x 512 = 362,496.
  c.moe_local_groups = {60, 66, 60, 70};
  EXPECT_DOUBLE_EQ(optim::moe_split_backward_bytes(c), 362496);
}

// The zero-bubble schedules (zb-h1, zb-v, dualpipev; optim/split_backward.h): each micro-batch's MoE linears hold
// their X and dY from B to W, and B walks the last block's experts one by one with that micro-batch's own groups
// (train/diagnostics_moe.cpp's chunk_rows). Where the peak is: the forward (U) with a micro-batch held until W
// (m 4, I 88; the output gradient's zero row was the last stage's missing 256 bytes a block), B's (X) (I 512: the
// mean groups were 0.9% under), the shared experts' backward first, ZeRO-3's units beside B; under a V the last
// stage's forward with a micro-batch's chunk-1 input gradient waiting for its chunk-0 B (one [b, s, h] the walk had
// let go of at chunk 1's W: +0.67%). Every rank to the byte but the loss's scalars.
TEST(MoELedger, ZeroBubbleHoldsTheExpertsUntilW) {
  const std::string zb = kLaptop + " --pp 2 --microbatches 4 --batch 4 --schedule ";
  const RankCase cases[] = {
      {"moe_ledger_zbh1", 2, zb + "zb-h1"},
      {"moe_ledger_zbh1_wide_bf16", 2, zb + "zb-h1 --mlp-hidden 512 --dtype bf16"},
      {"moe_ledger_zbh1_wide_e8", 2, zb + "zb-h1 --mlp-hidden 512 --experts 8"},
      {"moe_ledger_zbh1_shared2", 2, zb + "zb-h1 --shared-experts 2"},
      {"moe_ledger_zbh1_capacity", 2, zb + "zb-h1 --capacity-factor 0.8"},
      {"moe_ledger_zbh1_dp2_ep2_wide", 4, zb + "zb-h1 --dp 2 --ep 2 --mlp-hidden 512"},
      {"moe_ledger_zbh1_dp2_zero3_wide", 4, zb + "zb-h1 --dp 2 --zero 3 --mlp-hidden 512 --layers 4", 0, 0, 3},
      {"moe_ledger_zbv", 2, zb + "zb-v --virtual-stages 2"},
      {"moe_ledger_dualpipev_wide", 2, zb + "dualpipev --virtual-stages 2 --mlp-hidden 512"},
      {"moe_ledger_zbv_dp2_ep2", 4, zb + "zb-v --virtual-stages 2 --dp 2 --ep 2"}};
  for (const RankCase& c : cases) expect_every_rank_is_the_formula(c);
}
