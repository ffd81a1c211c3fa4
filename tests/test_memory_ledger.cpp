// --memory-report's ledger for every kind of run (issue 18 §4): each rank's
// params, gradient buffer and optimizer state, measured by the allocator,
// against optim/memory_report.h's formula (per parameter: fp32 4 + 4 + 8,
// bf16/fp16 2 + 4 + 12, the optimizer part / dp under --zero), read from the
// --memory-json file, within 1% either way: measured exceeds the formula by the
// buckets' padding and AdamW's step counters, and under ZeRO a dp rank whose
// shard holds the padding has that much less optimizer state than N / dp.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/train_gpt_run.h"

using namespace loom;
using namespace loom::test;

namespace {

struct Mode {
  const char* name;
  int ranks;
  const char* args;
  double bytes_per_param;  // the formula's params + grads + optimizer, per parameter
};

void PrintTo(const Mode& m, std::ostream* os) { *os << m.name << ": " << m.args; }

class MemoryLedger : public ::testing::TestWithParam<Mode> {};

}  // namespace

TEST_P(MemoryLedger, MeasuredEqualsTheFormulaOnEveryRank) {
  const Mode& m = GetParam();
  const fs::path json_path = work_dir() / (std::string(m.name) + "_memory.json");
  Result r = train(m.name, m.ranks, std::string(m.args) + " --memory-json " + json_path.string());
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream f(json_path);
  ASSERT_TRUE(f.good()) << json_path;
  nlohmann::json ledger = nlohmann::json::parse(f);
  ASSERT_EQ(ledger["ranks"].size(), size_t(m.ranks));
  for (const auto& rank : ledger["ranks"]) {
    const double n = rank["num_params"].get<double>();
    ASSERT_GT(n, 0);
    double predicted_total = 0;
    for (const char* kind : {"params", "grads", "optimizer"}) {
      const double measured = rank[kind]["measured"].get<double>(), predicted = rank[kind]["predicted"].get<double>();
      EXPECT_NEAR(measured, predicted, 0.01 * predicted) << m.name << " rank " << rank["rank"] << " " << kind;
      predicted_total += predicted;
    }
    EXPECT_NEAR(predicted_total / n, m.bytes_per_param, 0.01) << m.name << " rank " << rank["rank"];
    EXPECT_GT(rank["activations_peak"].get<double>(), 0) << m.name;
  }
}

// 2 + 4 + 12 / dp for 16-bit params with ZeRO; fp32 4 + 4 + 8 (/ dp under ZeRO).
INSTANTIATE_TEST_SUITE_P(
    EveryMode, MemoryLedger,
    ::testing::Values(Mode{"one_process_fp32", 1, "--batch 16", 16.0}, Mode{"dp2_fp32", 2, "--dp 2 --batch 8", 16.0},
                      Mode{"dp2_fp32_zero", 2, "--dp 2 --batch 8 --zero", 12.0},
                      Mode{"dp2_bf16_zero", 2, "--dp 2 --batch 8 --zero --dtype bf16", 12.0},
                      Mode{"pp2_fp16", 2, "--pp 2 --microbatches 2 --batch 8 --dtype fp16", 18.0},
                      Mode{"tp2_fp32", 2, "--tp 2 --batch 16", 16.0},
                      Mode{"tp2_sp_bf16", 2, "--tp 2 --sequence-parallel --batch 16 --dtype bf16", 18.0},
                      Mode{"dp2_tp2_bf16_zero", 4, "--dp 2 --tp 2 --batch 8 --dtype bf16 --zero", 12.0},
                      Mode{"pp2_tp2_fp32", 4, "--pp 2 --tp 2 --microbatches 2 --batch 8", 16.0}),
    [](const auto& info) { return std::string(info.param.name); });
