// --memory-report's ledger for a mixture of experts (nn/moe.h; issue 45): the experts' params, gradients and optimizer
// state by loom's bytes per param, the router's and the experts' activations by optim/moe_activations.h, each against
// the allocator, read from --memory-json; and the expert-parallel term of the formula (predict_memory_moe: the experts'
// state over their expert-dp group), and each rank's ledger under --dp and --ep (its E / ep experts, their own gradient
// buffer, and the rows the all-to-all brought them), ZeRO-1/2 over expert-dp, --tp (+SP) and --recompute full, ZeRO-3
// (its gathered units, .grad tensors and reduce-scatter beside the activations; under --pp too, interleaved included);
// with --shared-experts and --capacity-factor too.
#include <gtest/gtest.h>

#include "optim/memory_report.h"
#include "optim/moe_activations.h"
#include "tests/memory_ledger_moe.h"

using namespace loom;
using namespace loom::test;

// N = 16 x 32 = 512 tokens, k 2: M = 1024 rows, E 4, I 88, C 64, fp32:
//   router   probs 4 x 512 x 4 + picked 4 x 1024 + their sum 4 x 512 + weights 4 x 1024 = 18,432
//   indices  8 x (1024 + 1024 + 1024) = 24,576
//   rows     4 x (1024 x 64 + 4 x 1024 x 88 + 1025 x 64 + 1024 x 64) = 2,228,480
// = 2,271,488 bytes a block (measured on one layer: 2,402,560 with its output [512, 64] fp32, 131,072).
TEST(MoEActivations, KeptBytesAreTheTablesCount) {
  optim::ActivationCase c;
  c.micro_batch = 16, c.seq = 32, c.width = 64, c.mlp_hidden = 88, c.element_bytes = 4;
  c.moe_experts = 4, c.moe_experts_per_token = 2;
  EXPECT_DOUBLE_EQ(optim::moe_kept_bytes(c), 18432 + 24576 + 2228480);
  // Backward (M): 2 x 4 x 512 x 2 x 64 + 12 x 1024 = 536,576 (measured on the layer alone, to the byte).
  c.moe_largest_group = 274;
  EXPECT_DOUBLE_EQ(optim::moe_backward_bytes(c), 536576);
  // (U): the experts' output 4 x 1024 x 64 + the logits 4 x 512 x 4 + the weighted slots 4 x 1024 x 64 + the
  // sum's float64 accumulator 8 x 512 x 64 + its result 4 x 512 x 64.
  EXPECT_DOUBLE_EQ(optim::moe_forward_bytes(c), 262144 + 8192 + 262144 + 262144 + 131072);
  // bf16, (M) at index_add: its source in fp32 4 x 65536, its fp32 sum 4 x 1025 x 64, rounded 2 x 1025 x 64.
  c.element_bytes = 2;
  EXPECT_DOUBLE_EQ(optim::moe_backward_bytes(c), 262144 + 262400 + 131200);
}

// The experts' state over their expert-dp group: dp 4, ep 2, bf16, ZeRO-1: a dense param costs 2 + 4 +
// 12 / 4 bytes, an expert's 2 + 4 + 12 / 2.
TEST(MoELedger, ExpertStateIsShardedOverTheExpertDpGroup) {
  const optim::MemoryPrediction p = optim::predict_memory_moe(1000, 4000, kBFloat16, 4, 2, 1);
  EXPECT_EQ(p.params, 2 * 5000);
  EXPECT_EQ(p.grads, 4 * 5000);
  EXPECT_EQ(p.optimizer, 12 * 1000 / 4 + 12 * 4000 / 2);
  const optim::MemoryPrediction one = optim::predict_memory_moe(1000, 4000, kBFloat16, 4, 1, 1);  // ep 1: as dense
  EXPECT_EQ(one.optimizer, 12 * 5000 / 4);
}

// One process: params, .grad tensors (fp32) or the main_grad buffer (bf16) and AdamW's state are the
// formula's (loom's bytes per param: the experts are params like any other; AdamW's step counters are
// the 1% either way). The activations' peak: measured = formula to the byte but the loss's scalars on
// the laptop config and its variants - (U) the last block's forward is the fp32 peak, (M) unpermute's
// backward the bf16 one, and --grad-accum 2 adds the first micro-batch's .grad tensors to (U); with
// wide experts (I 512 against C 64) (X), walked expert by expert with each one's .grad tensors (the
// largest group alone was -0.28% here, +0.82% on the default corpus). --recompute full: the last
// block's forward runs again inside its backward, its (U) with the whole block rebuilt beside the kept
// inputs (optim/activation_moments.cpp's moe_rerun).
// --shared-experts (a SwiGLU of width S I beside the routed experts, nn/moe.h): S 1 peaks at (S), the sum
// of the routed and shared outputs in the last block's forward; S 2 in the shared experts' product
// backward, which runs before the routed experts' (with c_proj's .grad tensor alive).
// --capacity-factor: each block keeps the rows its routing kept (here 12% and 23% of the slots dropped), the
// blocks' mean for what they keep and the last block's at its moments, read from the routing's counts; under
// --recompute full each block's rerun with its own rows (fp32, .grad tensors: the first block's rerun peaks).
TEST(MoELedger, ParamsGradsOptimizerAndActivationsAreTheFormulas) {
  struct Case {
    const char* name;
    std::string flags;
    double activation_tolerance;
  } cases[] = {{"moe_ledger_fp32", kLaptop, 1e-4},
               {"moe_ledger_bf16", kLaptop + " --dtype bf16", 1e-4},
               {"moe_ledger_k1", kLaptop + " --experts-per-token 1", 1e-4},
               {"moe_ledger_c32", kLaptop + " --embd 32 --heads 2", 1e-4},
               {"moe_ledger_accum", kLaptop + " --batch 8 --grad-accum 2", 1e-4},
               {"moe_ledger_wide", kLaptop + " --mlp-hidden 512", 1e-4},
               {"moe_ledger_full", kLaptop + " --recompute full", 1e-4},
               {"moe_ledger_full_bf16", kLaptop + " --recompute full --dtype bf16", 1e-4},
               {"moe_ledger_shared", kLaptop + " --shared-experts 1", 1e-4},
               {"moe_ledger_shared2", kLaptop + " --shared-experts 2", 1e-4},
               {"moe_ledger_capacity", kLaptop + " --capacity-factor 1.0", 1e-4},
               {"moe_ledger_capacity_shared_bf16", kLaptop + " --capacity-factor 0.8 --shared-experts 1 --dtype bf16", 1e-4},
               {"moe_ledger_capacity_full", kLaptop + " --capacity-factor 0.8 --recompute full", 1e-4}};
  for (const Case& c : cases) {
    const nlohmann::json r = ledger(c.name, c.flags);
    for (const char* row : {"params", "grads", "optimizer"})
      EXPECT_NEAR(r[row]["measured"].get<double>() / r[row]["predicted"].get<double>(), 1.0, 0.01)
          << c.name << " " << row;
    const double measured = r["activations"]["measured"], predicted = r["activations"]["predicted"];
    std::printf("[ measured ] %s: activations %.0f measured, %.0f formula (%+.2f%%)\n", c.name, measured, predicted,
                100 * (measured / predicted - 1));
    EXPECT_NEAR(measured / predicted, 1.0, c.activation_tolerance) << c.name;
  }
}


// An expert: w1, w3 [88, 64] and w2 [64, 88]; 2 layers of 4: an ep rank holds half of them.
constexpr int64_t kExperts = 2 * 4 * 3 * 88 * 64;
// --shared-experts 1: one more such SwiGLU a layer, on every rank.
constexpr int64_t kShared = 2 * 3 * 88 * 64;

// --dp and --ep, ZeRO 0: each rank holds the dense params and its E / ep experts, their gradients (the
// experts' in a buffer of their own, its padding in comm) and Adam's moments; its activations keep the
// rows the dispatch brought its experts (optim/moe_activations.h's ep table, from the routing's counts).
// I 512: the experts' backward (X) is the peak on some ranks, walked over the local experts; with a
// capacity too, where unpermute's backward has freed N k slots and M kept rows (M < N k).
// --recompute selective (the attention core rebuilt) and full (each block's rerun with the rows its own
// dispatch received, the costliest block's the peak; C 32 bf16: the unsort's backward, (K), on rank 1) and
// --pp 2 too, where the last stage measures the formula less the gradient it sent when that isend completed
// first (optim/activation_memory.h); with a capacity, each micro-batch in flight keeps its own rows (stage 0
// holds two: train/diagnostics_moe.cpp's walk), under --recompute full each one's reruns too (two blocks a stage).
TEST(MoELedger, ExpertParallelRanksAreTheFormulas) {
  const int64_t whole = ledger("moe_ledger_ep1", kLaptop)["num_params"];
  const RankCase cases[] = {
      {"moe_ledger_dp2", 2, kLaptop + " --dp 2", whole},
      {"moe_ledger_dp2_ep2", 2, kLaptop + " --dp 2 --ep 2", whole - kExperts / 2},
      {"moe_ledger_dp2_ep2_bf16", 2, kLaptop + " --dp 2 --ep 2 --dtype bf16", whole - kExperts / 2},
      {"moe_ledger_dp4_ep2", 4, kLaptop + " --dp 4 --ep 2", whole - kExperts / 2},
      {"moe_ledger_dp2_ep2_wide", 2, kLaptop + " --dp 2 --ep 2 --mlp-hidden 512"},
      {"moe_ledger_dp2_ep2_selective", 2, kLaptop + " --dp 2 --ep 2 --recompute selective", whole - kExperts / 2},
      {"moe_ledger_dp2_ep2_full", 2, kLaptop + " --dp 2 --ep 2 --recompute full", whole - kExperts / 2},
      {"moe_ledger_dp2_ep2_full_bf16", 2, kLaptop + " --dp 2 --ep 2 --recompute full --dtype bf16 --embd 32 --heads 2"},
      {"moe_ledger_dp2_ep2_shared", 2, kLaptop + " --dp 2 --ep 2 --shared-experts 1", whole - kExperts / 2 + kShared},
      {"moe_ledger_dp2_ep2_capacity_wide", 2, kLaptop + " --dp 2 --ep 2 --capacity-factor 1.0 --mlp-hidden 512"},
      {"moe_ledger_pp2", 2, kLaptop + " --pp 2", 0, 16 * 32 * 64 * 4},
      {"moe_ledger_pp2_capacity_full", 2, kLaptop + " --pp 2 --capacity-factor 0.8 --recompute full --layers 4", 0,
       16 * 32 * 64 * 4, 0, true},
      {"moe_ledger_pp2_m4_capacity", 2, kLaptop + " --pp 2 --microbatches 4 --batch 4 --capacity-factor 0.8", 0,
       4 * 32 * 64 * 4, 0, true}};
  for (const RankCase& c : cases) expect_every_rank_is_the_formula(c);
}

// --ep (or a capacity) with --grad-accum: each micro-batch brings a rank's experts its own rows (keeps its own), and
// the peak is the micro-batch whose rows cost most, not the last (reading the last's was +1.2% to +3.1% under it on the
// rank whose earlier micro-batch got more): the formula walks every micro-batch's routing (nn/moe.h's loads).
// Dropless too, where each micro-batch's experts get their own groups: I 512 (the (X) walk's peak), one process
// (a later micro-batch sums into the .grad tensors the first made: counting them again was 3.4% over) and 1F1B
// (the largest group's mean over the micro-batches was 0.15% off; with the walk's first .grad tensors, 2-4%).
TEST(MoELedger, GradAccumPeaksInItsCostliestMicroBatch) {
  const RankCase cases[] = {{"moe_ledger_dp2_ep2_accum", 2, kLaptop + " --dp 2 --ep 2 --batch 4 --grad-accum 4"},
                            {"moe_ledger_capacity_accum", 1, kLaptop + " --capacity-factor 0.8 --batch 4 --grad-accum 4"},
                            {"moe_ledger_wide_accum", 1, kLaptop + " --mlp-hidden 512 --batch 4 --grad-accum 4"},
                            {"moe_ledger_pp2_wide", 2,
                             kLaptop + " --pp 2 --microbatches 4 --batch 4 --layers 4 --mlp-hidden 512", 0,
                             4 * 32 * 64 * 4, 0, true}};
  for (const RankCase& c : cases) expect_every_rank_is_the_formula(c);
}

// --ep under ZeRO-1/2 (optim/distributed_optimizer.h): the experts' buffers are reduce-scattered over their expert-dp
// group (dp / ep = 2 ranks here), the dense ones over dp (4): each rank keeps 1/2 of its experts' optimizer state and
// 1/4 of the rest; ZeRO-2 also only their gradients' shards and each buffer's own scratches (two here: --bucket-mb 0.12
// cuts both into several buckets). The experts' param buffer's padding joins comm: I 89 makes an expert's matrices 89 x
// 64 = 44.5 x 128 elements, and a bucket of five of them (0.12 MiB holds 31457 fp32) is padded by 64 to a multiple of
// expert-dp x 64 = 128. Under --tp as well: each tp rank holds its E / ep experts whole (the router's and the experts'
// partial gradients summed over tp before the reduce-scatter), sharded over the same expert-dp group.
TEST(MoELedger, ExpertShardsUnderZeroAreTheFormulas) {
  const std::string odd = kLaptop + " --mlp-hidden 89 --dp 4 --ep 2 --bucket-mb 0.12";
  // With --tp 2 too (each tp rank's experts whole, sharded over its expert-dp group; I 90, which tp divides).
  const std::string tp = kLaptop + " --mlp-hidden 90 --dp 2 --ep 2 --tp 2 --bucket-mb 0.12";
  const RankCase cases[] = {{"moe_ledger_dp4_ep2_zero1", 4, odd + " --zero 1 --dtype bf16", 0, 0, 1},
                            {"moe_ledger_dp4_ep2_zero2", 4, odd + " --zero 2", 0, 0, 2},
                            {"moe_ledger_ep2_tp2_zero1_sp", 4, tp + " --zero 1 --sequence-parallel --dtype bf16", 0, 0, 1},
                            {"moe_ledger_ep2_tp2_zero2", 4, tp + " --zero 2 --shared-experts 1", 0, 0, 2}};
  for (const RankCase& c : cases) expect_every_rank_is_the_formula(c);
}

// Tensor parallelism: the router and the routed experts are whole on every tp rank (parallel/tensor_parallel/ block.h),
// so the MoE block keeps all of its tensors there, not 1 / tp; under sequence parallelism each tp rank routes its T /
// tp tokens, and keeps its sharded input rather than a gathered copy. The shared experts are split over tp as a dense
// MLP, and under SP peak at their c_proj's reduce-scatter (16-bit: in fp32 buffers) in the last block's forward.
TEST(MoELedger, TensorParallelRanksAreTheFormulas) {
  const RankCase cases[] = {{"moe_ledger_tp2", 2, kLaptop + " --tp 2"},
                            {"moe_ledger_tp2_sp_bf16", 2, kLaptop + " --tp 2 --sequence-parallel --dtype bf16"},
                            {"moe_ledger_tp2_full", 2, kLaptop + " --tp 2 --recompute full"},
                            {"moe_ledger_tp2_sp_full_bf16", 2, kLaptop + " --tp 2 --sequence-parallel --recompute full --dtype bf16"},
                            {"moe_ledger_dp2_ep2_tp2_sp", 4, kLaptop + " --dp 2 --ep 2 --tp 2 --sequence-parallel"},
                            {"moe_ledger_tp2_sp_shared_bf16", 2,
                             kLaptop + " --tp 2 --sequence-parallel --shared-experts 1 --dtype bf16"}};
  for (const RankCase& c : cases) expect_every_rank_is_the_formula(c);
}

// ZeRO-3 (parallel/data_parallel/fully_sharded.h): params, grads and optimizer state are this rank's shards (each
// block's experts a unit of their own over expert-dp under --ep), comm the gathered working set at its peak; the
// activations' peak also counts what ZeRO-3 holds beside them at each moment (optim/zero3_activations.h): the units
// gathered (the layer computing and the one prefetched; without reshard after forward every earlier one too), the
// layer's .grad tensors and the reduce-scatter in flight. Without them the formula was 5% under (dp 2 fp32). I 512
// under --ep: the experts' backward (X) peaks, with the .grad tensors of the experts done before. --recompute full: the
// first block's rerun peaks, beside the second block's reduce-scatter in flight. --pp 2 --ep 2: each stage's own units,
// each micro-batch in flight its own received rows (train/diagnostics_moe.cpp's walk): stage 0 to the byte, the last
// stage the formula less its sent gradient, or another micro-batch's moment once it is let go.
TEST(MoELedger, ZeroThreeRanksAreTheFormulas) {
  const RankCase cases[] = {
      {"moe_ledger_dp2_zero3", 2, kLaptop + " --dp 2 --zero 3", 0, 0, 3},
      // I 512, one micro-batch: (X) walked with each expert's .grad tensors alive until the block's unit is
      // reduce-scattered (the largest group alone: 0.5% and 1.4% over)
      {"moe_ledger_dp2_zero3_wide", 2, kLaptop + " --dp 2 --zero 3 --mlp-hidden 512", 0, 0, 3},
      // I 512 at few tokens a micro-batch: a block's unit (its experts in it) outweighs its activations, and the
      // peak is (R), the last block's flattened gradient beside its .grad tensors (15% under without it; with
      // --pp 2 on stage 0 the received gradient too)
      {"moe_ledger_dp2_zero3_wide_accum_k1", 2,
       kLaptop + " --dp 2 --zero 3 --mlp-hidden 512 --batch 4 --grad-accum 4 --experts-per-token 1", 0, 0, 3},
      {"moe_ledger_dp2_pp2_zero3_wide", 4,
       kLaptop + " --dp 2 --pp 2 --microbatches 4 --batch 4 --mlp-hidden 512 --zero 3", 0, 4 * 32 * 64 * 4, 3, true,
       2},
      {"moe_ledger_dp2_ep2_zero3_shared_bf16", 2, kLaptop + " --dp 2 --ep 2 --zero 3 --shared-experts 2 --dtype bf16",
       0, 0, 3},
      {"moe_ledger_dp2_zero3_capacity_accum", 2, kLaptop + " --dp 2 --zero 3 --capacity-factor 0.8 --batch 8 --grad-accum 2",
       0, 0, 3},
      {"moe_ledger_dp4_ep2_zero3_wide_no_prefetch", 4,
       kLaptop + " --mlp-hidden 512 --dp 4 --ep 2 --zero 3 --zero3-prefetch off", 0, 0, 3},
      {"moe_ledger_dp2_zero3_full", 2, kLaptop + " --dp 2 --zero 3 --recompute full", 0, 0, 3},
      {"moe_ledger_dp2_ep2_zero3_full_bf16", 2, kLaptop + " --dp 2 --ep 2 --zero 3 --recompute full --dtype bf16", 0, 0, 3},
      {"moe_ledger_dp2_ep2_pp2_zero3", 4, kLaptop + " --dp 2 --ep 2 --pp 2 --zero 3", 0, 16 * 32 * 64 * 4, 3, true, 2},
      {"moe_ledger_dp2_ep2_pp2_zero3_no_reshard_full", 4, kLaptop + " --dp 2 --ep 2 --pp 2 --zero 3 --recompute full "
       "--zero3-reshard-after-forward off --layers 8 --embd 32 --heads 2 --mlp-hidden 256", 0, 16 * 32 * 32 * 4, 3, true, 2}};
  for (const RankCase& c : cases) expect_every_rank_is_the_formula(c);
}

// --cp (dropless): each rank routes its T / cp tokens; attention is the ring's, which keeps its out and lse
// and the micro-batches' zig-zag tokens (optim/ring_activations.h), in every moment; the ring's backward is
// not the peak here (the last block's forward (U) is in fp32), as it is in the dense ledger's cp modes.
TEST(MoELedger, ContextParallelRanksAreTheFormulas) {
  const RankCase cases[] = {{"moe_ledger_cp2", 2, kLaptop + " --cp 2"},
                            {"moe_ledger_dp2_ep2_cp2_full_bf16", 4,
                             kLaptop + " --dp 2 --ep 2 --cp 2 --batch 8 --recompute full --dtype bf16"}};
  for (const RankCase& c : cases) expect_every_rank_is_the_formula(c);
}

// Interleaved 1F1B (optim/pipeline_activations.cpp): each chunk's micro-batches keep their own rows (a capacity's,
// --ep's: diagnostics_moe.cpp's chunk_rows), a MoE block's forward (U) is a candidate with those kept then, and under
// ZeRO-3 each chunk counts its own units. With the last micro-batch's rows for all, stage 0 was +1.2% (ep 2); with
// (U) at the backwards, the capacity's 2304 bytes above. Both stages send gradients (sent, or between on the last).
// Under ZeRO-3 with --ep stage 0 is between too: exact on a quiet machine, but with two busy loops beside the run
// it measured 1536 and 16384 (one sent gradient) below the formula (timing: isends completing later).
TEST(MoELedger, InterleavedChunksKeepEachMicroBatchsRows) {
  const std::string v2 = kLaptop + " --pp 2 --virtual-stages 2 --layers 4 --microbatches 4 --batch 4";
  const RankCase cases[] = {{"moe_ledger_pp2_v2_m4_capacity", 2, v2 + " --capacity-factor 0.8", 0, 4 * 32 * 64 * 4},
                            {"moe_ledger_dp2_ep2_pp2_v2_zero3_bf16", 4, v2 + " --dp 2 --ep 2 --zero 3 --dtype bf16", 0,
                             4 * 32 * 64 * 2, 3, true, 4}};
  for (const RankCase& c : cases) expect_every_rank_is_the_formula(c);
}

// Interleaved 1F1B under --recompute full: each chunk's blocks rerun with their own rows (a capacity's kept, --ep's
// received), the costliest block's (optim/pipeline_activations.cpp's reruns). Four layers over pp 2 x 2 chunks put
// two blocks in stage 1's first chunk and none in its last (the head alone), eight layers two in every chunk. With
// the last block's rows alone the capacity's stage 1 was 0.85% above the formula, --ep's last stage 1.03%; the
// head's chunk, counted as rerunning a block, put dropless experts' stage 1 2.3% (k 2) and 6.0% (k 1) below it.
// Under ZeRO-3 each earlier block's rerun sits beside the next block's reduce-scatter; the whole chunk's count,
// taken beside the blocks' own, put --ep's stage 1 a block's reduce-scatter (100,608 bytes, 4.1%) below it.
// Every stage sends gradients, so each rank may measure up to one sent gradient below the formula (timing). A
// chunk without the head keeps the gradient it received beside an earlier block's rerun (+ [b s h]: exact on
// stage 0 of the ep run, one sent gradient below it without; a sent gradient is as large, so this run cannot
// tell them apart on stage 1).
TEST(MoELedger, InterleavedFullRecomputationRerunsEachBlockWithItsOwnRows) {
  const std::string v2 = kLaptop + " --pp 2 --virtual-stages 2 --layers 4 --microbatches 4 --batch 4 --recompute full";
  const double sent = 4 * 32 * 64 * 4;
  const RankCase cases[] = {{"moe_ledger_pp2_v2_full_k1", 2, v2 + " --experts-per-token 1", 0, sent, 0, true, 2},
                            {"moe_ledger_pp2_v2_full_capacity", 2, v2 + " --capacity-factor 0.8", 0, sent, 0, true, 2},
                            {"moe_ledger_pp2_v2_full_capacity_l8", 2, v2 + " --capacity-factor 0.8 --layers 8", 0,
                             sent, 0, true, 2},
                            {"moe_ledger_dp2_ep2_pp2_v2_full", 4, v2 + " --dp 2 --ep 2", 0, sent, 0, true, 4},
                            {"moe_ledger_dp2_ep2_pp2_v2_full_zero3_l8", 4, v2 + " --dp 2 --ep 2 --zero 3 --layers 8", 0,
                             sent, 3, true, 4},
                            {"moe_ledger_dp2_pp2_v2_full_zero3_capacity_bf16_l8", 4,
                             v2 + " --dp 2 --zero 3 --layers 8 --capacity-factor 0.8 --dtype bf16", 0, sent / 2, 3,
                             true, 4}};
  for (const RankCase& c : cases) expect_every_rank_is_the_formula(c);
}

// A pipeline chunk of the head alone (blocks 0) reruns no block under --recompute full: its backward's moments
// are the dense head's, experts or not (they were counted as a MoE block's rerun and its experts' .grad tensors).
TEST(MoEActivations, AChunkOfTheHeadAloneRerunsNoBlock) {
  optim::ActivationCase c;
  c.micro_batch = 4, c.seq = 32, c.width = 64, c.heads = 4, c.vocab = 40, c.mlp_hidden = 88, c.element_bytes = 4;
  c.swiglu = c.rmsnorm = c.rope = true, c.bias = false, c.tied = true, c.has_head = true, c.blocks = 0;
  c.recompute = parallel::Recompute::Full, c.grad_bytes = 10496;
  const optim::ActivationPrediction dense = optim::predict_activations(c);
  c.moe_experts = 4, c.moe_experts_per_token = 2;
  const optim::ActivationPrediction experts = optim::predict_activations(c);
  EXPECT_GT(dense.backward_moments, 0);
  EXPECT_DOUBLE_EQ(experts.backward_moments, dense.backward_moments);
  EXPECT_DOUBLE_EQ(experts.total, dense.total);
}
