// What a --zero 3 --trace timeline shows (parallel/data_parallel/fully_sharded.h,
// parallel/trace/trace.h), read back from the file on 2 ranks, tiny GPT:
//   - every all-gather and reduce-scatter on the communication track, named
//     for its unit ("for": "unit 2"), as many per step as the schedule says;
//   - prefetch: the next unit's all-gather is in flight while this layer
//     computes (its launch-to-completion slice overlaps the "layer l forward"
//     / "layer l backward" span), and without prefetch it never is;
//   - the bytes: ZeRO-3 sends 1.5x ZeRO-1's per step, to the byte.
// The model: layers 0 (embedding: wte, wpe), 1, 2 (blocks), 3 (head: ln_f,
// and the tied wte, which is unit 0's); unit u is layer u's params.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/train_gpt_run.h"

using namespace loom;
using namespace loom::test;

namespace {

struct TraceSpan {
  std::string name, what;  // what: the "for" of a collective ("unit 2"), else ""
  double begin = 0, end = 0;
  int64_t bytes = 0;
};

// One rank's row of the trace.
struct TraceRow {
  std::vector<TraceSpan> compute;   // tid 0: forward, backward, "layer l forward", waits, optimizer step
  std::vector<TraceSpan> comm;      // tid 1: each collective while the communication thread runs it
  std::vector<TraceSpan> launched;  // tid 1, async: each collective from its launch to its completion
};

std::map<int, TraceRow> read_trace(const fs::path& path) {
  std::ifstream f(path);
  const nlohmann::json trace = nlohmann::json::parse(f);
  std::map<int, TraceRow> rows;
  std::map<int64_t, TraceSpan> open;  // async slices by id, until their end
  for (const auto& e : trace["traceEvents"]) {
    const std::string ph = e["ph"];
    if (ph == "M") continue;
    TraceSpan s{e["name"], "", e["ts"].get<double>(), 0, 0};
    if (e.contains("args")) {
      s.bytes = e["args"].value("bytes", int64_t(0));
      s.what = e["args"].value("for", std::string());
    }
    TraceRow& row = rows[e["pid"].get<int>()];
    if (ph == "X") {
      s.end = s.begin + e["dur"].get<double>();
      (e["tid"].get<int>() == 0 ? row.compute : row.comm).push_back(s);
    } else if (ph == "b") {
      open[e["id"].get<int64_t>()] = s;
    } else if (ph == "e") {
      TraceSpan done = open.at(e["id"].get<int64_t>());
      done.end = e["ts"].get<double>();
      row.launched.push_back(done);
    }
  }
  return rows;
}

bool is_dp(const TraceSpan& s, const std::string& verb) {
  return s.name.starts_with(verb + "(") && s.name.find(" dp ") != std::string::npos;
}
bool overlaps(const TraceSpan& a, const TraceSpan& b) { return a.begin < b.end && b.begin < a.end; }

// The steps after the first: from one "optimizer step" span's start to the
// next's (a whole forward and backward, and everything they launched).
std::vector<std::pair<double, double>> steps_of(const TraceRow& row) {
  std::vector<double> starts;
  for (const TraceSpan& s : row.compute)
    if (s.name == "optimizer step") starts.push_back(s.begin);
  std::sort(starts.begin(), starts.end());
  std::vector<std::pair<double, double>> out;
  for (size_t i = 0; i + 1 < starts.size(); ++i) out.push_back({starts[i], starts[i + 1]});
  return out;
}

std::vector<TraceSpan> within(const std::vector<TraceSpan>& spans, std::pair<double, double> step) {
  std::vector<TraceSpan> out;
  for (const TraceSpan& s : spans)
    if (s.begin >= step.first && s.begin < step.second) out.push_back(s);
  return out;
}

const TraceSpan* find(const std::vector<TraceSpan>& spans, const std::string& name) {
  for (const TraceSpan& s : spans)
    if (s.name == name) return &s;
  return nullptr;
}

// Bytes each rank sends per step in the dp all-gathers and reduce-scatters: a
// ring collective over N ranks of a B-byte buffer sends B (N - 1) / N.
double sent_per_step(const TraceRow& row, int n) {
  const auto steps = steps_of(row);
  double bytes = 0;
  for (const auto& step : steps)
    for (const TraceSpan& s : within(row.comm, step))
      if (is_dp(s, "all_gather") || is_dp(s, "reduce_scatter")) bytes += double(s.bytes) * (n - 1) / n;
  return bytes / double(steps.size());
}

// Each unit's element count padded to a multiple of dp, from the saved model
// (names as nn/gpt.h gives them): [embedding, block 0, block 1, head].
std::vector<int64_t> padded_units(const nn::SafetensorsFile& weights, int dp) {
  std::vector<int64_t> units(4, 0);
  for (const auto& [name, t] : weights.tensors) {
    const size_t u = name.starts_with("wte.") || name.starts_with("wpe.") ? 0
                     : name.starts_with("blocks.0.")                      ? 1
                     : name.starts_with("blocks.1.")                      ? 2
                                                                          : 3;
    EXPECT_TRUE(u < 3 || name.starts_with("ln_f.")) << name;
    units[u] += t.numel();
  }
  for (int64_t& p : units) p = (p + dp - 1) / dp * dp;
  return units;
}

const std::string kTraced = "--dp 2 --batch 8 --steps 4 --zero 3 --trace ";

}  // namespace

// Per step and rank: forward gathers each unit once and the embedding's again
// for the head's tied wte; backward gathers the two blocks (the head's unit is
// kept after the last forward, the embedding's from the head's backward on);
// each unit's gradient is reduce-scattered once. While layer l computes its
// forward the all-gather of unit l + 1 is in flight; in backward, while layer
// l computes, that of unit l - 1.
TEST(TrainGptZero3Trace, EachUnitsGathersAndReduceScatterOnTheCommTrackPrefetchedUnderCompute) {
  const fs::path path = work_dir() / "zero3_trace.json";
  Result r = train("zero3_trace", 2, kTraced + path.string());
  ASSERT_EQ(r.status, 0) << r.output;
  const auto rows = read_trace(path);
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& [rank, row] : rows) {
    const auto steps = steps_of(row);
    ASSERT_EQ(steps.size(), 3u) << "rank " << rank;
    for (const auto& step : steps) {
      const auto compute = within(row.compute, step), launched = within(row.launched, step);
      const TraceSpan *forward = find(compute, "forward"), *backward = find(compute, "backward");
      ASSERT_TRUE(forward && backward) << "rank " << rank;
      std::map<std::string, int> gathers_fwd, gathers_bwd, reduce_scatters;
      for (const TraceSpan& s : launched) {
        if (is_dp(s, "all_gather")) {
          ASSERT_FALSE(s.what.empty()) << s.name << ": an all-gather without its unit";
          if (s.begin < forward->end) ++gathers_fwd[s.what];
          else if (s.begin < backward->end) ++gathers_bwd[s.what];
        }
        if (is_dp(s, "reduce_scatter")) ++reduce_scatters[s.what];
      }
      const std::map<std::string, int> fwd = {{"unit 0", 2}, {"unit 1", 1}, {"unit 2", 1}, {"unit 3", 1}};
      const std::map<std::string, int> bwd = {{"unit 1", 1}, {"unit 2", 1}};
      const std::map<std::string, int> rs = {{"unit 0", 1}, {"unit 1", 1}, {"unit 2", 1}, {"unit 3", 1}};
      EXPECT_EQ(gathers_fwd, fwd) << "rank " << rank << ": all-gathers in forward";
      EXPECT_EQ(gathers_bwd, bwd) << "rank " << rank << ": all-gathers in backward";
      EXPECT_EQ(reduce_scatters, rs) << "rank " << rank << ": reduce-scatters";
      // Prefetch: the gather of the next unit to compute is in flight while this layer computes.
      for (auto [layer, next, dir] : {std::tuple{0, 1, "forward"}, {1, 2, "forward"}, {2, 3, "forward"},
                                      {3, 2, "backward"}, {2, 1, "backward"}}) {
        const TraceSpan* span = find(compute, str("layer ", layer, " ", dir));
        ASSERT_TRUE(span) << "rank " << rank << ": no span 'layer " << layer << " " << dir << "'";
        bool in_flight = false;
        for (const TraceSpan& s : launched)
          if (is_dp(s, "all_gather") && s.what == str("unit ", next) && (std::string(dir) == "forward") ==
              (s.begin < forward->end))
            in_flight |= overlaps(s, *span);
        EXPECT_TRUE(in_flight) << "rank " << rank << ": unit " << next << "'s all-gather is not in flight during "
                               << "layer " << layer << "'s " << dir;
      }
    }
    // The bytes: what each unit's collectives carry, per step (fp32 throughout).
    const std::vector<int64_t> p = padded_units(r.weights, 2);
    const int64_t psi = p[0] + p[1] + p[2] + p[3];
    const int64_t gathered = (psi + p[0]) + (p[1] + p[2]), reduce_scattered = psi;
    EXPECT_EQ(gathered + reduce_scattered, 3 * psi - p[3]);
    EXPECT_DOUBLE_EQ(sent_per_step(row, 2), 4.0 * double(gathered + reduce_scattered) / 2) << "rank " << rank;
  }
}

// --zero3-prefetch off: each unit is gathered in its own layer's pre-hook, so
// no gather is in flight while the layer before it computes - and the bytes
// are the same.
TEST(TrainGptZero3Trace, WithoutPrefetchNoGatherOverlapsThePreviousLayer) {
  const fs::path path = work_dir() / "zero3_trace_noprefetch.json";
  Result r = train("zero3_trace_noprefetch", 2, kTraced + path.string() + " --zero3-prefetch off");
  ASSERT_EQ(r.status, 0) << r.output;
  for (const auto& [rank, row] : read_trace(path)) {
    int overlapping = 0, gathers = 0;
    for (const auto& step : steps_of(row)) {
      const auto compute = within(row.compute, step);
      for (const TraceSpan& s : within(row.launched, step)) {
        if (!is_dp(s, "all_gather")) continue;
        ++gathers;
        for (const TraceSpan& c : compute)
          if (c.name.starts_with("layer ") && overlaps(s, c)) ++overlapping;
      }
    }
    EXPECT_EQ(gathers, 3 * 7) << "rank " << rank;
    EXPECT_EQ(overlapping, 0) << "rank " << rank << ": with --zero3-prefetch off a gather ran beside a layer";
    const std::vector<int64_t> p = padded_units(r.weights, 2);
    EXPECT_DOUBLE_EQ(sent_per_step(row, 2), 4.0 * double(3 * (p[0] + p[1] + p[2] + p[3]) - p[3]) / 2);
  }
}

// ZeRO-1 on the same model: its gradient buffer reduce-scattered and its
// params all-gathered once a step, 2 Ψ (N - 1) / N bytes sent per rank - where
// ZeRO-3 sends 3 Ψ (N - 1) / N less the head's unit (the first test), 1.5x.
TEST(TrainGptZero3Trace, ZeroOneSendsTwoPsiPerStep) {
  const fs::path path = work_dir() / "zero1_trace.json";
  Result r = train("zero1_trace", 2, "--dp 2 --batch 8 --steps 4 --zero 1 --trace " + path.string());
  ASSERT_EQ(r.status, 0) << r.output;
  int64_t psi = 0;
  for (const auto& [name, t] : r.weights.tensors) psi += t.numel();
  const int64_t psi_padded = (psi + 127) / 128 * 128;  // the bucket padded to a multiple of dp x 64 (bucket.h)
  const std::vector<int64_t> p = padded_units(r.weights, 2);
  for (const auto& [rank, row] : read_trace(path)) {
    const double sent = sent_per_step(row, 2), zero3 = 4.0 * double(3 * psi - p[3]) / 2;
    EXPECT_DOUBLE_EQ(sent, 4.0 * double(2 * psi_padded) / 2) << "rank " << rank;
    EXPECT_NEAR(zero3 / sent, 1.5, 0.01);
    std::printf("[ measured ] dp 2, fp32, %lld params, rank %d: ZeRO-1 sends %.0f bytes a step, ZeRO-3 %.0f (%.4fx)\n",
                (long long)psi, rank, sent, zero3, zero3 / sent);
  }
}
