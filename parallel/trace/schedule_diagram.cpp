#include "parallel/trace/schedule_diagram.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <tuple>
#include <utility>

#include "parallel/trace/schedule_svg.h"

namespace loom::parallel {

double schedule_clock_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {

int num_chunks(const std::vector<StageEvents>& stages) {
  int v = 1;
  for (const StageEvents& evs : stages)
    for (const ScheduleEvent& e : evs) v = std::max(v, e.chunk + 1);
  return v;
}

// What event e on stage s waits for: (stage, chunk), or stage -1 for nothing.
// Forwards come from the stage before (around the ring to the chunk before),
// backwards (B) from the stage after (around the ring to the chunk after). In
// a V chunk 1 runs back up the stages, and stage p - 1 turns it: its F on
// chunk 1 waits for its own F on chunk 0, its B on chunk 0 for its B on chunk 1.
std::pair<int, int> dependency(const ScheduleEvent& e, int s, int p, int v, ChunkLayout layout) {
  if (e.kind == 'W') return {-1, 0};  // a B's other half: after its B on this stage, in the stage's order
  if (layout == ChunkLayout::V) {
    const bool from_above = (e.kind == 'F') == (e.chunk == 0);  // F on chunk 0, B on chunk 1: from stage s - 1
    if (from_above) return s > 0 ? std::pair{s - 1, e.chunk} : std::pair{-1, 0};
    return s < p - 1 ? std::pair{s + 1, e.chunk} : std::pair{s, 1 - e.chunk};
  }
  if (e.kind == 'F') {
    if (s > 0) return {s - 1, e.chunk};
    return e.chunk > 0 ? std::pair{p - 1, e.chunk - 1} : std::pair{-1, 0};
  }
  if (s < p - 1) return {s + 1, e.chunk};
  return e.chunk < v - 1 ? std::pair{0, e.chunk + 1} : std::pair{-1, 0};
}

}  // namespace

namespace {

// Each event's start when every event takes duration(e) and starts as soon as
// its stage is free and its dependency (F on the stage before, B on the stage
// after) has ended, plus `latency` when that was on another stage (a transfer;
// the V's turn is in memory): nothing else waits. Durations 1 give the slots
// of the diagram; the measured durations give the step without transfers.
template <class Duration>
std::vector<std::vector<double>> place_events(const std::vector<StageEvents>& stages, const Duration& duration,
                                              ChunkLayout layout, double latency = 0) {
  const int p = int(stages.size()), v = num_chunks(stages);
  // (kind, mb, chunk) -> when it ended
  std::vector<std::map<std::tuple<char, int, int>, double>> ended(static_cast<size_t>(p));
  std::vector<std::vector<double>> starts(static_cast<size_t>(p));
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<double> stage_free(static_cast<size_t>(p), 0);
  size_t remaining = 0;
  for (int s = 0; s < p; ++s) {
    starts[size_t(s)].assign(stages[size_t(s)].size(), -1);
    remaining += stages[size_t(s)].size();
  }
  // Sweep the stages, placing each one's next event as soon as it can run.
  while (remaining > 0) {
    bool progress = false;
    for (int s = 0; s < p; ++s) {
      const StageEvents& evs = stages[size_t(s)];
      while (next[size_t(s)] < evs.size()) {
        const ScheduleEvent& e = evs[next[size_t(s)]];
        const auto [dep, dep_chunk] = dependency(e, s, p, v, layout);
        double ready = 0;
        if (dep >= 0) {
          auto it = ended[size_t(dep)].find({e.kind, e.mb, dep_chunk});
          if (it == ended[size_t(dep)].end()) break;  // not yet placed: come back on the next sweep
          ready = it->second + (dep != s ? latency : 0);
        }
        const double start = std::max(stage_free[size_t(s)], ready);
        starts[size_t(s)][next[size_t(s)]++] = start;
        ended[size_t(s)][{e.kind, e.mb, e.chunk}] = stage_free[size_t(s)] = start + duration(e);
        --remaining, progress = true;
      }
    }
    LOOM_CHECK(progress, "schedule_slots: the logged order cannot have run (an event waits for one that never "
               "comes); ", remaining, " events left");
  }
  return starts;
}

}  // namespace

std::vector<std::vector<int>> schedule_slots(const std::vector<StageEvents>& stages, ChunkLayout layout) {
  const std::vector<std::vector<double>> starts =
      place_events(stages, [](const ScheduleEvent&) { return 1.0; }, layout);
  std::vector<std::vector<int>> slots(starts.size());
  for (size_t s = 0; s < starts.size(); ++s)
    for (double t : starts[s]) slots[s].push_back(int(t));
  return slots;
}

std::vector<StageEvents> without_transfers(const std::vector<StageEvents>& stages, ChunkLayout layout) {
  return with_transfer_latency(stages, 0, layout);
}

std::vector<StageEvents> with_transfer_latency(const std::vector<StageEvents>& stages, double latency_us,
                                               ChunkLayout layout) {
  const std::vector<std::vector<double>> starts =
      place_events(stages, [](const ScheduleEvent& e) { return e.end_us - e.start_us; }, layout, latency_us);
  std::vector<StageEvents> out = stages;
  for (size_t s = 0; s < out.size(); ++s)
    for (size_t k = 0; k < out[s].size(); ++k) {
      const double d = out[s][k].end_us - out[s][k].start_us;
      out[s][k].start_us = starts[s][k], out[s][k].end_us = starts[s][k] + d;
    }
  return out;
}

std::string render_schedule(const std::vector<StageEvents>& stages, const std::string& title, ChunkLayout layout) {
  std::vector<std::vector<int>> slots = schedule_slots(stages, layout);
  const bool chunks = num_chunks(stages) > 1;
  auto cell = [&](const ScheduleEvent& e) {
    return chunks ? str(e.kind, e.mb, ".", e.chunk) : str(e.kind, e.mb);
  };
  size_t width = 0;  // "F12" is 3 wide, "F12.1" 5
  int num_slots = 0;
  for (size_t s = 0; s < stages.size(); ++s)
    for (size_t k = 0; k < stages[s].size(); ++k) {
      width = std::max(width, cell(stages[s][k]).size());
      num_slots = std::max(num_slots, slots[s][k] + 1);
    }
  bool split = false;  // a zero-bubble schedule: the backward as B and W
  for (const StageEvents& evs : stages)
    for (const ScheduleEvent& e : evs) split = split || e.kind == 'W';
  const std::string legend = split ? chunks ? " (F<i>.<c>/B<i>.<c>/W<i>.<c>: forward/input gradient/weight gradient of "
                                              "micro-batch i on chunk c; . idle)\n"
                                            : " (F<i>/B<i>/W<i>: forward/input gradient/weight gradient of micro-batch "
                                              "i; . idle)\n"
                                   : chunks ? " (F<i>.<c>/B<i>.<c>: forward/backward of micro-batch i on chunk c; . idle)\n"
                                            : " (F<i>/B<i>: forward/backward of micro-batch i; . idle)\n";
  std::string out = title + legend;
  for (size_t s = 0; s < stages.size(); ++s) {
    std::vector<std::string> row(size_t(num_slots), ".");
    for (size_t k = 0; k < stages[s].size(); ++k) row[size_t(slots[s][k])] = cell(stages[s][k]);
    out += "stage " + std::to_string(s) + " |";
    for (std::string& cell : row) out += " " + cell + std::string(width - cell.size(), ' ');
    while (!out.empty() && out.back() == ' ') out.pop_back();
    out += "\n";
  }
  return out;
}

double measured_bubble_fraction(const std::vector<StageEvents>& stages) {
  double first = std::numeric_limits<double>::infinity(), last = -first;
  for (const StageEvents& evs : stages)
    for (const ScheduleEvent& e : evs) first = std::min(first, e.start_us), last = std::max(last, e.end_us);
  if (stages.empty() || !(last > first)) return 0;
  double sum = 0;
  for (const StageEvents& evs : stages) {
    double busy = 0;
    for (const ScheduleEvent& e : evs) busy += e.end_us - e.start_us;
    sum += 1.0 - busy / (last - first);
  }
  return sum / double(stages.size());
}

double busiest_stage_bubble_fraction(const std::vector<StageEvents>& stages) {
  double first = std::numeric_limits<double>::infinity(), last = -first, busiest = 0;
  for (const StageEvents& evs : stages) {
    double busy = 0;
    for (const ScheduleEvent& e : evs) {
      first = std::min(first, e.start_us), last = std::max(last, e.end_us);
      busy += e.end_us - e.start_us;
    }
    busiest = std::max(busiest, busy);
  }
  return last > first ? 1.0 - busiest / (last - first) : 0;
}

double theoretical_bubble_fraction(int pp_size, int num_microbatches, int num_chunks) {
  return double(pp_size - 1) / double(num_chunks * num_microbatches + pp_size - 1);
}

double zb_h1_bubble_fraction(int pp_size, int num_microbatches) {
  return double(pp_size - 1) / double(3 * num_microbatches + pp_size - 1);
}

double zb_v_bubble_fraction(int pp_size, int num_microbatches) {
  return double(pp_size - 1) / double(6 * num_microbatches + pp_size - 1);
}

std::vector<StageEvents> gather_schedule(ProcessGroup& pp_group, const StageEvents& mine) {
  // Counts first, then every stage's events padded to the longest (all_gather needs equal sizes):
  // 5 doubles per event (kind, mb, start, end, chunk).
  const int p = pp_group.size();
  Tensor counts = zeros({p}, kInt64);
  pp_group.all_gather(counts, from_vector<int64_t>({int64_t(mine.size())}));
  std::vector<int64_t> n = counts.to_vector<int64_t>();
  const int64_t longest = std::max<int64_t>(1, *std::max_element(n.begin(), n.end()));
  std::vector<double> flat(size_t(longest * 5), 0.0);
  for (size_t k = 0; k < mine.size(); ++k) {
    flat[5 * k] = double(mine[k].kind), flat[5 * k + 1] = double(mine[k].mb);
    flat[5 * k + 2] = mine[k].start_us, flat[5 * k + 3] = mine[k].end_us, flat[5 * k + 4] = double(mine[k].chunk);
  }
  Tensor all = zeros({p * longest * 5}, kFloat64);
  pp_group.all_gather(all, from_vector(flat));
  if (pp_group.rank() != 0) return {};
  std::vector<double> v = all.to_vector<double>();
  std::vector<StageEvents> stages(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s)
    for (int64_t k = 0; k < n[size_t(s)]; ++k) {
      const double* e = &v[size_t((s * longest + k) * 5)];
      stages[size_t(s)].push_back({char(e[0]), int(e[1]), e[2], e[3], int(e[4])});
    }
  return stages;
}

std::string schedule_report(ProcessGroup& pp_group, const StageEvents& mine, const std::string& schedule_name,
                            std::string* svg) {
  std::vector<StageEvents> stages = gather_schedule(pp_group, mine);
  if (pp_group.rank() != 0) return "";
  const int p = int(stages.size()), v = num_chunks(stages);
  const int m = int(std::count_if(stages[0].begin(), stages[0].end(), [](const ScheduleEvent& e) {
    return e.kind == 'F';
  })) / v;
  // Three bubbles, each 1 - busy / span averaged over the stages: as it ran
  // (waiting for transfers included), the same forwards and backwards
  // replayed with instant transfers, and the formula (equal stages, no transfers).
  char bubble[400];
  const double measured = measured_bubble_fraction(stages);
  const ChunkLayout layout = schedule_chunk_layout(schedule_name);
  const double replayed = measured_bubble_fraction(without_transfers(stages, layout));
  const bool split = std::any_of(stages[0].begin(), stages[0].end(), [](const ScheduleEvent& e) { return e.kind == 'W'; });
  if (split && layout == ChunkLayout::V)  // ZB-V, DualPipeV: p - 1 idle chunk slots of 6 m per stage
    std::snprintf(bubble, sizeof bubble,
                  "bubble: measured %.3f with transfers, %.3f without (the same F/B/W spans replayed back to back), "
                  "theory with F = B = W on a chunk (p - 1)/(6 m + p - 1) = %d/%d = %.3f (ZB-H1's: %.3f, 1F1B's: "
                  "%.3f)\n",
                  measured, replayed, p - 1, 6 * m + p - 1, zb_v_bubble_fraction(p, m), zb_h1_bubble_fraction(p, m),
                  theoretical_bubble_fraction(p, m));
  else if (split)  // zero bubble (zero_bubble_schedule.h): idle (p - 1)(F + B - W) of m (F + B + W) per stage
    std::snprintf(bubble, sizeof bubble,
                  "bubble: measured %.3f with transfers, %.3f without (the same F/B/W spans replayed back to back), "
                  "theory with F = B = W (p - 1)/(3 m + p - 1) = %d/%d = %.3f (1F1B's: (p - 1)/(m + p - 1) = %.3f)\n",
                  measured, replayed, p - 1, 3 * m + p - 1, zb_h1_bubble_fraction(p, m),
                  theoretical_bubble_fraction(p, m));
  else if (v == 1)
    std::snprintf(bubble, sizeof bubble,
                  "bubble: measured %.3f with transfers, %.3f without (the same F/B spans replayed back to back), "
                  "theory (p - 1)/(m + p - 1) = %d/%d = %.3f\n",
                  measured, replayed, p - 1, m + p - 1, theoretical_bubble_fraction(p, m));
  else
    std::snprintf(bubble, sizeof bubble,
                  "bubble: measured %.3f with transfers, %.3f without (the same F/B spans replayed back to back), "
                  "theory (p - 1)/(v m + p - 1) = %d/%d = %.3f (Megatron's bubble/compute (p - 1)/(v m) = %d/%d "
                  "= %.3f)\n",
                  measured, replayed, p - 1, v * m + p - 1, theoretical_bubble_fraction(p, m, v), p - 1, v * m,
                  double(p - 1) / double(v * m));
  const std::string title = str(schedule_name, ", pp ", p, v > 1 ? str(", v ", v) : "", ", m ", m);
  if (svg) *svg = schedule_svg(stages, title, std::string(bubble, std::strlen(bubble) - 1));  // without the \n
  return render_schedule(stages, title, layout) + bubble;
}

}  // namespace loom::parallel
