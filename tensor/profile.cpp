#include "tensor/profile.h"

#include <time.h>

#include <atomic>
#include <thread>

namespace loom::profile {
namespace {

std::atomic<bool> g_on{false};
std::thread::id g_thread;
std::map<std::string, Entry> g_totals;
Scope* g_innermost = nullptr;  // the recording thread's open scope (only it touches this)

}  // namespace

void start() {
  g_totals.clear();
  g_innermost = nullptr;
  g_thread = std::this_thread::get_id();
  g_on.store(true, std::memory_order_release);
}

std::map<std::string, Entry> stop() {
  g_on.store(false, std::memory_order_release);
  return std::move(g_totals);
}

bool recording() {
  return g_on.load(std::memory_order_relaxed) && std::this_thread::get_id() == g_thread;
}

void Scope::open(std::string name, double flops, double bytes) {
  open_ = true;
  name_ = std::move(name), flops_ = flops, bytes_ = bytes;
  parent_ = g_innermost;
  g_innermost = this;
  begin_cpu_ = thread_cpu_seconds();
  begin_ = std::chrono::steady_clock::now();
}

void Scope::close() {
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin_).count();
  const double total_cpu = thread_cpu_seconds() - begin_cpu_;
  g_innermost = parent_;
  if (parent_) parent_->children_ += total, parent_->children_cpu_ += total_cpu;
  Entry& e = g_totals[name_];
  e.seconds += total - children_;
  e.cpu_seconds += total_cpu - children_cpu_;
  e.calls += 1;
  e.flops += flops_;
  e.bytes += bytes_;
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

std::string shape(int64_t m, int64_t k, int64_t n) {
  return std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
}

}  // namespace loom::profile
