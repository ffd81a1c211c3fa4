#include "parallel/trace/schedule_diagram.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <utility>

#include "parallel/trace/schedule_svg.h"

namespace loom::parallel {

double schedule_clock_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<std::vector<int>> schedule_slots(const std::vector<StageEvents>& stages) {
  const int p = int(stages.size());
  std::vector<std::map<std::pair<char, int>, int>> end_slot(static_cast<size_t>(p));  // (kind, mb) -> slot after it
  std::vector<std::vector<int>> slots(static_cast<size_t>(p));
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<int> stage_free(static_cast<size_t>(p), 0);
  size_t remaining = 0;
  for (int s = 0; s < p; ++s) {
    slots[size_t(s)].assign(stages[size_t(s)].size(), -1);
    remaining += stages[size_t(s)].size();
  }
  // Sweep the stages, placing each one's next event as soon as the stage is
  // free and its dependency (F on the stage before, B on the stage after) is done.
  while (remaining > 0) {
    bool progress = false;
    for (int s = 0; s < p; ++s) {
      const StageEvents& evs = stages[size_t(s)];
      while (next[size_t(s)] < evs.size()) {
        const ScheduleEvent& e = evs[next[size_t(s)]];
        const int dep = e.kind == 'F' ? s - 1 : s + 1;
        int ready = 0;
        if (dep >= 0 && dep < p) {
          auto it = end_slot[size_t(dep)].find({e.kind, e.mb});
          if (it == end_slot[size_t(dep)].end()) break;  // not yet placed: come back on the next sweep
          ready = it->second;
        }
        int slot = std::max(stage_free[size_t(s)], ready);
        slots[size_t(s)][next[size_t(s)]++] = slot;
        end_slot[size_t(s)][{e.kind, e.mb}] = slot + 1;
        stage_free[size_t(s)] = slot + 1;
        --remaining, progress = true;
      }
    }
    LOOM_CHECK(progress, "schedule_slots: the logged order cannot have run (an event waits for one that never "
               "comes); ", remaining, " events left");
  }
  return slots;
}

std::string render_schedule(const std::vector<StageEvents>& stages, const std::string& title) {
  std::vector<std::vector<int>> slots = schedule_slots(stages);
  int max_mb = 0, num_slots = 0;
  for (size_t s = 0; s < stages.size(); ++s)
    for (size_t k = 0; k < stages[s].size(); ++k) {
      max_mb = std::max(max_mb, stages[s][k].mb);
      num_slots = std::max(num_slots, slots[s][k] + 1);
    }
  const size_t width = std::to_string(max_mb).size() + 1;  // "F12" is 3 wide
  std::string out = title + " (F<i>/B<i>: forward/backward of micro-batch i; . idle)\n";
  for (size_t s = 0; s < stages.size(); ++s) {
    std::vector<std::string> row(size_t(num_slots), ".");
    for (size_t k = 0; k < stages[s].size(); ++k)
      row[size_t(slots[s][k])] = stages[s][k].kind + std::to_string(stages[s][k].mb);
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

double theoretical_bubble_fraction(int pp_size, int num_microbatches) {
  return double(pp_size - 1) / double(num_microbatches + pp_size - 1);
}

std::vector<StageEvents> gather_schedule(ProcessGroup& pp_group, const StageEvents& mine) {
  // Counts first, then every stage's events padded to the longest (all_gather needs equal sizes):
  // 4 doubles per event (kind, mb, start, end).
  const int p = pp_group.size();
  Tensor counts = zeros({p}, kInt64);
  pp_group.all_gather(counts, from_vector<int64_t>({int64_t(mine.size())}));
  std::vector<int64_t> n = counts.to_vector<int64_t>();
  const int64_t longest = std::max<int64_t>(1, *std::max_element(n.begin(), n.end()));
  std::vector<double> flat(size_t(longest * 4), 0.0);
  for (size_t k = 0; k < mine.size(); ++k) {
    flat[4 * k] = double(mine[k].kind), flat[4 * k + 1] = double(mine[k].mb);
    flat[4 * k + 2] = mine[k].start_us, flat[4 * k + 3] = mine[k].end_us;
  }
  Tensor all = zeros({p * longest * 4}, kFloat64);
  pp_group.all_gather(all, from_vector(flat));
  if (pp_group.rank() != 0) return {};
  std::vector<double> v = all.to_vector<double>();
  std::vector<StageEvents> stages(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s)
    for (int64_t k = 0; k < n[size_t(s)]; ++k) {
      const double* e = &v[size_t((s * longest + k) * 4)];
      stages[size_t(s)].push_back({char(e[0]), int(e[1]), e[2], e[3]});
    }
  return stages;
}

std::string schedule_report(ProcessGroup& pp_group, const StageEvents& mine, const std::string& schedule_name,
                            std::string* svg) {
  std::vector<StageEvents> stages = gather_schedule(pp_group, mine);
  if (pp_group.rank() != 0) return "";
  const int p = int(stages.size());
  const int m = int(std::count_if(stages[0].begin(), stages[0].end(), [](const ScheduleEvent& e) {
    return e.kind == 'F';
  }));
  char bubble[160];
  std::snprintf(bubble, sizeof bubble,
                "bubble: measured %.3f (from timestamps), theory (p - 1)/(m + p - 1) = %d/%d = %.3f\n",
                measured_bubble_fraction(stages), p - 1, m + p - 1, theoretical_bubble_fraction(p, m));
  const std::string title = str(schedule_name, ", pp ", p, ", m ", m);
  if (svg) *svg = schedule_svg(stages, title, std::string(bubble, std::strlen(bubble) - 1));  // without the \n
  return render_schedule(stages, title) + bubble;
}

}  // namespace loom::parallel
