#include "parallel/comm/watchdog.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "tensor/error.h"
#include "tensor/numbers.h"

namespace loom::parallel::watchdog {

namespace {

std::mutex g_mutex;
std::condition_variable g_cv;
std::set<const Watched*> g_queues;
std::thread g_thread;
bool g_stop = false;

void run(int world_rank, double timeout, std::function<void(const std::string&)> abort_job) {
  // Look often enough that a short timeout (tests use 3 s) fires promptly.
  auto period = std::chrono::duration<double>(std::clamp(timeout / 10, 0.05, 1.0));
  std::unique_lock<std::mutex> lock(g_mutex);
  while (!g_cv.wait_for(lock, period, [] { return g_stop; })) {
    for (const Watched* q : g_queues) {
      auto r = q->running();
      if (!r || r->seconds < timeout) continue;
      std::string msg = str("[loom rank ", world_rank, "] collective watchdog: stuck for ", int(r->seconds),
                            " s in ", r->op, " #", r->seq, " (", r->bytes, " bytes) on group ", q->label(),
                            "; LOOM_COLLECTIVE_TIMEOUT=", timeout,
                            " s. Another rank probably skipped this collective or issued its collectives in a "
                            "different order. Aborting the job.");
      q->abort_communication();  // under the lock: q cannot go away meanwhile
      lock.unlock();
      abort_job(msg);
      std::abort();  // abort_job does not return; be sure
    }
  }
}

}  // namespace

double timeout_from_env() {
  // Below 0.1 s an ordinary collective would be taken for a hang; a week is "never".
  return env_number("LOOM_COLLECTIVE_TIMEOUT", 300.0, {0.1, 604800.0, " (seconds)"});
}

void start(int world_rank, double timeout_seconds, std::function<void(const std::string&)> abort_job) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_thread.joinable()) return;
  g_stop = false;
  g_thread = std::thread(run, world_rank, timeout_seconds, std::move(abort_job));
}

void stop() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_stop = true;
  }
  g_cv.notify_all();
  if (g_thread.joinable()) g_thread.join();
}

void watch(const Watched* queue) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_queues.insert(queue);
}

void unwatch(const Watched* queue) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_queues.erase(queue);
}

}  // namespace loom::parallel::watchdog
