#include "tensor/profile.h"

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
  begin_ = std::chrono::steady_clock::now();
}

void Scope::close() {
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin_).count();
  g_innermost = parent_;
  if (parent_) parent_->children_ += total;
  Entry& e = g_totals[name_];
  e.seconds += total - children_;
  e.calls += 1;
  e.flops += flops_;
  e.bytes += bytes_;
}

std::string shape(int64_t m, int64_t k, int64_t n) {
  return std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
}

}  // namespace loom::profile
