#include "parallel/comm/watchdog.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
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

std::unique_ptr<Peers> g_peers;

// This rank's LocalWork in progress, by id: what and since when (its own
// mutex, so that a LocalWork never waits while the watchdog thread asks).
std::mutex g_work_mutex;
std::map<uint64_t, std::pair<std::string, std::chrono::steady_clock::time_point>> g_local_work;
uint64_t g_next_work = 0;

// How long a stuck rank waits for the others to say where they are. Their
// watchdog threads look for questions every period (at most 1 s), so a live
// rank answers well within this, even on a loaded machine.
constexpr double kAskSeconds = 3;

// What this rank's queues are doing:
// "world (size 2): in all_reduce(sum, float32) #7 for 3 s; dp (size 2): idle after #4".
std::string state_locked() {
  std::string s;
  {
    std::lock_guard<std::mutex> lock(g_work_mutex);  // LocalWork first: an answer is cut at 4 KB
    for (const auto& [id, work] : g_local_work)
      s += str(s.empty() ? kBusy : "; ", work.first, " for ",
               int(std::chrono::duration<double>(std::chrono::steady_clock::now() - work.second).count()), " s");
  }
  for (const Watched* q : g_queues) {
    if (!s.empty()) s += "; ";
    auto r = q->running();
    s += r ? str(q->label(), ": in ", r->op, " #", r->seq, " for ", int(r->seconds), " s")
           : str(q->label(), ": idle after #", q->started());
  }
  return s.empty() ? "no process groups" : s;
}

void run(int world_rank, double timeout, std::function<void(const std::string&)> abort_job) {
  // Look often enough that a short timeout (tests use 3 s) fires promptly.
  auto period = std::chrono::duration<double>(std::clamp(timeout / 10, 0.05, 1.0));
  // A collective (queue, sequence number) that waits on a busy peer: the
  // waiting time at which the watchdog asks again, and how often it did.
  struct Extension {
    uint64_t seq = 0;
    double until = 0;
    int count = 0;
  };
  std::map<const Watched*, Extension> extended;
  std::unique_lock<std::mutex> lock(g_mutex);
  while (!g_cv.wait_for(lock, period, [] { return g_stop; })) {
    if (g_peers) g_peers->serve(state_locked);
    for (const Watched* q : g_queues) {
      auto r = q->running();
      if (!r || r->seconds < timeout) continue;
      Extension& e = extended[q];
      if (e.seq == r->seq && r->seconds < e.until) continue;  // a peer was busy: wait on
      // Where the others are tells a rank that skipped this collective from
      // one that cannot answer at all, or one busy outside collectives (LocalWork).
      bool busy_peer = false;
      std::string diagnosis = g_peers ? g_peers->ask(state_locked(), kAskSeconds, &busy_peer)
                                      : "Another rank probably skipped this collective or issued its collectives in "
                                        "a different order.";
      if (busy_peer && (e.seq != r->seq || e.count < kBusyExtensions)) {
        e = {r->seq, r->seconds + timeout, e.seq == r->seq ? e.count + 1 : 1};
        std::fprintf(stderr, "[loom rank %d] collective watchdog: %s #%llu on group %s has waited %d s, for a rank "
                     "busy outside collectives: waiting on (LOOM_COLLECTIVE_TIMEOUT=%g s, %d of %d times). %s\n",
                     world_rank, r->op.c_str(), (unsigned long long)r->seq, q->label().c_str(), int(r->seconds),
                     timeout, e.count, kBusyExtensions, diagnosis.c_str());
        continue;
      }
      std::string msg = str("[loom rank ", world_rank, "] collective watchdog: stuck for ", int(r->seconds),
                            " s in ", r->op, " #", r->seq, " (", r->bytes, " bytes) on group ", q->label(),
                            "; LOOM_COLLECTIVE_TIMEOUT=", timeout, " s. ", diagnosis, " Aborting the job.");
      q->abort_communication();  // under the lock: q cannot go away meanwhile
      lock.unlock();
      abort_job(msg);
      std::abort();  // abort_job does not return; be sure
    }
  }
}

}  // namespace

double timeout_from_env() {
  // Below a second a healthy collective is taken for a hang: a rank waits in one while the slowest
  // finishes its compute (a step of a small model on a loaded laptop; 0.1 s fired in healthy runs). A
  // week is "never".
  return env_number("LOOM_COLLECTIVE_TIMEOUT", 300.0, {1.0, 604800.0, " (seconds)"});
}

void start(int world_rank, double timeout_seconds, std::function<void(const std::string&)> abort_job,
           std::unique_ptr<Peers> peers) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_thread.joinable()) return;
  g_stop = false;
  g_peers = std::move(peers);
  g_thread = std::thread(run, world_rank, timeout_seconds, std::move(abort_job));
}

void stop() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_stop = true;
  }
  g_cv.notify_all();
  if (g_thread.joinable()) g_thread.join();
  g_peers.reset();  // before MPI_Finalize: it cancels its posted receive
}

LocalWork::LocalWork(std::string what) {
  std::lock_guard<std::mutex> lock(g_work_mutex);
  id_ = g_next_work++;
  g_local_work[id_] = {std::move(what), std::chrono::steady_clock::now()};
}

LocalWork::~LocalWork() {
  std::lock_guard<std::mutex> lock(g_work_mutex);
  g_local_work.erase(id_);
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
