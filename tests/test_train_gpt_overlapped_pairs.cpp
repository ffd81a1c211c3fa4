// --overlap-pairs (parallel/pipeline_parallel/overlapped_pairs.h): DualPipeV
// with each pair's F on a second thread while B and W run on the first.
// Every run is bit-identical to DualPipeV one half after the other - losses,
// grad norms, final weights - with the tied embedding (stage 0's F reads wte
// while its W accumulates into wte's .grad), at pp 2 and 3, fp32 and bf16,
// with dp 2 (W's hooks launch the reductions beside a forward). --threads 2
// and a wider model make the GEMMs and loops split: each half runs the
// chunks of that split in turn on its own core (OneCoreGuard).
#include <gtest/gtest.h>

#include <cctype>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "tests/train_gpt_run.h"

using namespace loom;
using namespace loom::test;

namespace {

const char* const kDualPipeV = " --virtual-stages 2 --schedule dualpipev";

void overlapped_equals_one_after_the_other(const std::string& name, int ranks, const std::string& args) {
  Result overlapped = train(name + "_overlap", ranks, args + kDualPipeV + " --overlap-pairs");
  expect_bit_identical(overlapped, train(name + "_serial", ranks, args + kDualPipeV), name + " --overlap-pairs",
                       "dualpipev one half after the other");
}

}  // namespace

TEST(TrainGptOverlappedPairs, TwoAndThreeStagesAreBitIdenticalToOneHalfAfterTheOther) {
  overlapped_equals_one_after_the_other("pp2", 2, "--pp 2 --microbatches 6 --batch 4");
  overlapped_equals_one_after_the_other("pp3", 3, "--pp 3 --layers 4 --microbatches 8 --batch 2");
}

TEST(TrainGptOverlappedPairs, Bf16AndDataParallelAreBitIdenticalToOneHalfAfterTheOther) {
  overlapped_equals_one_after_the_other("pp2_bf16", 2, "--pp 2 --microbatches 6 --batch 4 --dtype bf16");
  overlapped_equals_one_after_the_other("dp2_pp2", 4, "--dp 2 --pp 2 --microbatches 4 --batch 2");
  overlapped_equals_one_after_the_other("dp2_pp2_zero1_bf16", 4,
                                        "--dp 2 --pp 2 --microbatches 4 --batch 2 --zero 1 --dtype bf16");
  overlapped_equals_one_after_the_other("dp2_pp3", 6, "--dp 2 --pp 3 --layers 4 --microbatches 6 --batch 2");
}

// Width 128, 64 tokens, --threads 2: the products and loops are split over
// two math threads one after the other, over one core each in the pairs.
TEST(TrainGptOverlappedPairs, TwoMathThreadsSplitTheSameWayInBothHalves) {
  overlapped_equals_one_after_the_other(
      "pp2_wide", 2, "--pp 2 --microbatches 4 --batch 4 --embd 128 --heads 4 --block 64 --threads 2");
}

TEST(TrainGptOverlappedPairs, RefusesWhatTalksInsideAChunk) {
  struct Case {
    int ranks;
    std::string args, message;
  };
  const std::string v = std::string(kDualPipeV) + " --overlap-pairs --microbatches 4";
  for (const Case& c :
       {Case{2, "--pp 2 --schedule zb-v --virtual-stages 2 --overlap-pairs",
             "--overlap-pairs runs DualPipeV's pairs at once; it needs --schedule dualpipev (got --schedule zb-v)"},
        Case{4, "--pp 2 --tp 2" + v, "--overlap-pairs with --tp 2: the pair's forward and backward would both talk"},
        Case{4, "--pp 2 --cp 2" + v, "--overlap-pairs with --cp 2: "},
        Case{4, "--pp 2 --dp 2 --zero 3" + v, "--overlap-pairs with --zero 3: "},
        Case{4, "--pp 2 --dp 2 --zero 1 --overlap-param-gather" + v, "--overlap-pairs with --overlap-param-gather: "}}) {
    Result r = train("refused", c.ranks, c.args, /*save=*/false);
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
}

namespace {

// Per rank (the trace's pid): how many of its F spans overlap one of its B spans in time.
std::map<int, int> forwards_beside_backwards(const fs::path& path) {
  std::ifstream f(path);
  const nlohmann::json trace = nlohmann::json::parse(f);
  std::map<int, std::vector<std::tuple<char, double, double>>> spans;  // pid -> (kind, begin, end)
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const std::string name = e["name"];
    if (name.size() < 2 || (name[0] != 'F' && name[0] != 'B') || !std::isdigit(name[1])) continue;
    const double begin = e["ts"].get<double>();
    spans[e["pid"].get<int>()].push_back({name[0], begin, begin + e["dur"].get<double>()});
  }
  std::map<int, int> overlapping;
  for (const auto& [pid, list] : spans) {
    overlapping[pid] = 0;
    for (const auto& [kf, f0, f1] : list)
      for (const auto& [kb, b0, b1] : list)
        if (kf == 'F' && kb == 'B' && f0 < b1 && b0 < f1) ++overlapping[pid];
  }
  return overlapping;
}

}  // namespace

// The trace's compute spans: one half after the other no F overlaps a B;
// overlapped, the pairs' do. Rank 0 has 7 pairs a step at pp 2, m 6, rank 1 8
// (dualpipev_schedule.h), 10 steps: at most 70 and 80. How many overlap is
// the machine's: at load average 15 on 2 cores (the CI's neighbours), 5-13
// and 37-39 did (the worker woke after the other half had finished), so the
// test asks for one. Width 128: ops of a millisecond or so, not tens of us.
TEST(TrainGptOverlappedPairs, TheTraceShowsEachPairsHalvesAtOnce) {
  const std::string args = "--pp 2 --microbatches 6 --batch 4 --embd 128 --heads 4 --block 64" + std::string(kDualPipeV);
  const fs::path serial = work_dir() / "serial_trace.json", overlapped = work_dir() / "overlap_trace.json";
  ASSERT_EQ(train("trace_serial", 2, args + " --trace " + serial.string(), false).status, 0);
  ASSERT_EQ(train("trace_overlap", 2, args + " --overlap-pairs --trace " + overlapped.string(), false).status, 0);
  const std::map<int, int> one_after_the_other = forwards_beside_backwards(serial);
  const std::map<int, int> at_once = forwards_beside_backwards(overlapped);
  ASSERT_EQ(at_once.size(), 2u);
  const int pairs[2] = {70, 80};
  for (const auto& [rank, n] : at_once) {
    std::printf("[ measured ] rank %d: %d of %d pairs' F beside their B (one after the other: %d)\n", rank, n,
                pairs[rank], one_after_the_other.at(rank));
    EXPECT_EQ(one_after_the_other.at(rank), 0) << "rank " << rank;
    EXPECT_GE(n, 1) << "rank " << rank;
    EXPECT_LE(n, pairs[rank]) << "rank " << rank;
  }
}

// --print-schedule lists the table's order, F then B and W, whichever half of a pair ended first.
TEST(TrainGptOverlappedPairs, PrintScheduleShowsTheTablesOrder) {
  Result r = train("overlap_print", 2, "--pp 2 --microbatches 4 --batch 4 --print-schedule --overlap-pairs" +
                                           std::string(kDualPipeV), false);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("stage 0 | F0.0 F1.0 F2.0 F0.1 B0.1 W0.1 F1.1 F3.0 B1.1 W1.1 F2.1 B0.0 W0.0 B2.1 W2.1 "
                          "F3.1 B1.0 W1.0 B3.1 W3.1 B2.0 W2.0"),
            std::string::npos)
      << r.output;
}
