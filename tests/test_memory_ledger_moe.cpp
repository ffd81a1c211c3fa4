// --memory-report's ledger for a mixture of experts (nn/moe.h; issue 45): the
// experts' params, gradients and optimizer state by loom's bytes per param,
// the router's and the experts' activations by optim/moe_activations.h, each
// against the allocator, read from --memory-json; and the expert-parallel term
// of the formula (predict_memory_moe: the experts' state over their expert-dp
// group), which train_gpt --ep will measure.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "optim/memory_report.h"
#include "optim/moe_activations.h"
#include "tests/train_gpt_run.h"

using namespace loom;
using namespace loom::test;

namespace {

// Rank 0's ledger of a one-process run: {row: {measured, predicted}}.
nlohmann::json ledger(const std::string& name, const std::string& flags) {
  const std::string json = (work_dir() / (name + ".memory.json")).string();
  const Result r = train(name, 1, flags + " --memory-report --memory-json " + json + " --steps 1", false);
  EXPECT_EQ(r.status, 0) << r.output;
  std::ifstream f(json);
  return nlohmann::json::parse(f)["ranks"][0];
}

const std::string kLaptop = "--arch llama --experts 4 --experts-per-token 2 --mlp-hidden 88 --layers 2 --heads 4 "
                            "--embd 64 --block 32 --batch 16";

}  // namespace

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
// the 1% either way). The activations' peak: the formula is 2.1-3.0% under the measurement (fp32
// +2.95%, bf16 +2.87%, k 1 +2.97%, C 32 +2.14% here): the peak is in the last block's forward, at
// unpermute's weighted sum, a moment not counted yet (optim/moe_activations.h); so 4%, not 1e-4.
// Leaving out the MoE's kept tensors (1.2 MiB of 8 at fp32) fails it.
TEST(MoELedger, ParamsGradsOptimizerAndActivationsAreTheFormulas) {
  struct Case {
    const char* name;
    std::string flags;
    double activation_tolerance;
  } cases[] = {{"moe_ledger_fp32", kLaptop, 0.04},
               {"moe_ledger_bf16", kLaptop + " --dtype bf16", 0.04},
               {"moe_ledger_k1", kLaptop + " --experts-per-token 1", 0.04},
               {"moe_ledger_c32", kLaptop + " --embd 32 --heads 2", 0.04}};
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
