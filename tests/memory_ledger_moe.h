// The memory ledger of a mixture of experts, read from --memory-json (tests/test_memory_ledger_moe.cpp, and
// the zero-bubble schedules' in tests/test_memory_ledger_zero_bubble.cpp): each rank's rows against the formula.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/train_gpt_run.h"

namespace loom::test {

// Every rank's ledger of a run on `ranks` processes: [rank]{row: {measured, predicted}}.
inline nlohmann::json ledgers(const std::string& name, int ranks, const std::string& flags) {
  const std::string json = (work_dir() / (name + ".memory.json")).string();
  const Result r = train(name, ranks, flags + " --memory-report --memory-json " + json + " --steps 1", false);
  EXPECT_EQ(r.status, 0) << r.output;
  std::ifstream f(json);
  return nlohmann::json::parse(f)["ranks"];
}
inline nlohmann::json ledger(const std::string& name, const std::string& flags) { return ledgers(name, 1, flags)[0]; }

// The laptop config of chapter 19: 2 Mixtral blocks of 4 experts, k 2, I 88, C 64, T 32, batch 16.
inline const std::string kLaptop = "--arch llama --experts 4 --experts-per-token 2 --mlp-hidden 88 --layers 2 "
                                   "--heads 4 --embd 64 --block 32 --batch 16";

// Every rank of a run against the formula: comm (the buckets' padding) to the byte, and params and
// grads the formula's plus that padding, to the byte: the grad buffers' (ZeRO-2's shards have theirs in
// the grads formula) and under ZeRO the param buffers'; so params alone at ZeRO 0, grads alone at ZeRO-2.
// The optimizer state within 1% (AdamW's step counters; a shard holding padding has less state). Activations
// to the byte but the loss's scalars (and a pipeline send's 80-byte header), or less the input gradient a stage
// sent (`sent`) when its isend completed first.
struct RankCase {
  const char* name;
  int ranks;
  std::string flags;
  int64_t params = 0;  // each rank's (0: not checked)
  double sent = 0;     // a pipeline's: the input gradient a stage sent, counted, gone when its isend completed first
  int zero = 0;        // --zero
  // A capacity or --ep under --pp 2: with the sent gradient let go, another micro-batch's moment (its own rows)
  // can be a last-stage rank's peak, anywhere from the formula less that gradient up to the formula (timing's:
  // seen -32768, -26208; dp 2 ep 2 pp 2 ZeRO-3: -98192, the first micro-batch's forward, on one rank of two).
  bool sent_or_less = false;
  int last_stage_ranks = 1;  // the last ranks, those of the last stage (pp is the grid's outermost axis)
};

inline void expect_every_rank_is_the_formula(const RankCase& c) {
  const nlohmann::json ranks = ledgers(c.name, c.ranks, c.flags);
  ASSERT_EQ(int(ranks.size()), c.ranks) << c.name;
  for (const nlohmann::json& r : ranks) {
    const std::string where = std::string(c.name) + " rank " + std::to_string(r["rank"].get<int>());
    if (c.params > 0) { EXPECT_EQ(r["num_params"].get<int64_t>(), c.params) << where; }
    auto beyond = [&](const char* row) { return r[row]["measured"].get<int64_t>() - r[row]["predicted"].get<int64_t>(); };
    const int64_t comm = r["comm"]["predicted"];
    EXPECT_EQ(r["comm"]["measured"].get<int64_t>(), comm) << where << " comm";
    if (c.zero == 3) {  // the shards, their padding in the formula; comm the gathered working set
      EXPECT_EQ(beyond("params"), 0) << where << " params";
      EXPECT_EQ(beyond("grads"), 0) << where << " grads";
    } else {
      EXPECT_EQ(beyond("params") + beyond("grads"), comm) << where << " params and grads beyond the formula";
    }
    if (c.zero == 0) { EXPECT_EQ(beyond("params"), 0) << where << " params"; }
    if (c.zero == 2) { EXPECT_EQ(beyond("grads"), 0) << where << " grads"; }
    EXPECT_NEAR(r["optimizer"]["measured"].get<double>() / r["optimizer"]["predicted"].get<double>(), 1.0, 0.01)
        << where << " optimizer";
    const double measured = r["activations"]["measured"], predicted = r["activations"]["predicted"];
    std::printf("[ measured ] %s: activations %.0f measured, %.0f formula (%+.3f%%)\n", where.c_str(), measured,
                predicted, 100 * (measured / predicted - 1));
    const double off = std::min(std::abs(measured / predicted - 1), std::abs((measured + c.sent) / predicted - 1));
    const bool between = c.sent_or_less && r["rank"].get<int>() >= c.ranks - c.last_stage_ranks &&
                         measured >= predicted - c.sent && measured <= predicted * (1 + 1e-4);
    EXPECT_TRUE(off < 1e-4 || between) << where;
  }
}

}  // namespace loom::test
