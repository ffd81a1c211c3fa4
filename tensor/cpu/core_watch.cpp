#include "tensor/cpu/core_watch.h"

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>

namespace loom::cpu {

CpuTicks parse_proc_stat(const std::string& text, const std::vector<int>& cpus) {
  CpuTicks ticks;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.compare(0, 3, "cpu") != 0) continue;
    std::istringstream fields(line);
    std::string name;
    fields >> name;
    const bool all = name == "cpu";
    if (cpus.empty() != all) continue;  // the total line, or the listed CPUs' own lines
    if (!all) {
      const int id = std::atoi(name.c_str() + 3);
      bool ours = false;
      for (int c : cpus) ours |= c == id;
      if (!ours) continue;
    }
    // user nice system idle iowait irq softirq steal (guest time is already in user)
    uint64_t v[8] = {};
    for (uint64_t& x : v) fields >> x;
    uint64_t total = 0;
    for (uint64_t x : v) total += x;
    ticks.total += total;
    ticks.busy += total - v[3] - v[4];
  }
  return ticks;
}

uint64_t parse_self_ticks(const std::string& text) {
  const size_t close = text.rfind(')');  // the name may hold spaces and parentheses
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 1));
  std::string skip;
  for (int field = 3; field <= 13; ++field) fields >> skip;  // state ... cmajflt
  uint64_t utime = 0, stime = 0;
  fields >> utime >> stime;
  return utime + stime;
}

namespace {

std::string read_file(const char* path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The watch: how many of our cores other programs kept busy over the last
// ~100 ms, updated by whichever thread finds it due (the others read it).
class CoreWatch {
 public:
  CoreWatch() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0)
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &set)) cpus_.push_back(c);
    ncores_ = cpus_.empty() ? 1 : int(cpus_.size());
  }

  double others_busy() {
    const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    if (now >= next_ns_.load(std::memory_order_relaxed) && mutex_.try_lock()) {
      std::lock_guard<std::mutex> hold(mutex_, std::adopt_lock);
      next_ns_.store(now + 100'000'000, std::memory_order_relaxed);
      measure();
    }
    return others_busy_.load(std::memory_order_relaxed);
  }
  int ncores() const { return ncores_; }

 private:
  void measure() {
    const CpuTicks ticks = parse_proc_stat(read_file("/proc/stat"), cpus_);
    const uint64_t self = parse_self_ticks(read_file("/proc/self/stat"));
    if (have_last_ && ticks.total > last_.total) {
      const double busy = double(ticks.busy - last_.busy), mine = double(self - last_self_);
      const double others = busy > mine ? (busy - mine) / double(ticks.total - last_.total) * ncores_ : 0.0;
      others_busy_.store(others, std::memory_order_relaxed);
    }
    last_ = ticks;
    last_self_ = self;
    have_last_ = ticks.total > 0;  // no /proc: nothing measured, the threads are woken (OpenMP's way)
  }

  std::vector<int> cpus_;
  int ncores_ = 1;
  std::mutex mutex_;
  std::atomic<int64_t> next_ns_{0};
  std::atomic<double> others_busy_{0.0};
  CpuTicks last_;
  uint64_t last_self_ = 0;
  bool have_last_ = false;
};

Wake wake_from_environment() {
  const char* e = std::getenv("LOOM_WAKE_THREADS");
  const std::string s = e ? e : "auto";
  if (s == "always") return Wake::kAlways;
  if (s == "never") return Wake::kNever;
  if (s != "auto")
    std::fprintf(stderr, "loom: LOOM_WAKE_THREADS=%s is not auto, always or never; using auto (measure)\n", s.c_str());
  return Wake::kAuto;
}

std::atomic<Wake>& wake_setting() {
  static std::atomic<Wake> wake{wake_from_environment()};
  return wake;
}

}  // namespace

void set_wake(Wake wake) { wake_setting() = wake; }

bool wake_math_threads(int threads) {
  const Wake wake = wake_setting().load(std::memory_order_relaxed);
  if (wake != Wake::kAuto) return wake == Wake::kAlways;
  static CoreWatch watch;
  return cores_free_for(watch.others_busy(), watch.ncores(), threads);
}

}  // namespace loom::cpu
