#include "parallel/pipeline_parallel/overlapped_pairs.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "parallel/pipeline_parallel/send_release.h"
#include "tensor/grad_mode.h"
#include "tensor/parallel.h"

namespace loom::parallel {

namespace {

bool is_pair(const std::vector<ScheduledOp>& order, size_t i) {
  if (i + 2 >= order.size()) return false;
  const ScheduledOp &f = order[i], &b = order[i + 1], &w = order[i + 2];
  return f.kind == 'F' && b.kind == 'B' && w.kind == 'W' && b.mb == w.mb && b.chunk == w.chunk &&
         b.chunk != f.chunk;
}

// Every rank's order run with each marked pair as one step that needs both its
// inputs before it sends either output; an op takes a slot, a pair two (F
// beside B then W, with F = B = W). Per rank: how far it got, and when each op
// ended (in slots; transfers take none).
struct Replay {
  std::vector<size_t> reached;
  std::vector<std::vector<double>> end;
};

Replay replay(const std::vector<std::vector<ScheduledOp>>& orders, const std::vector<std::vector<bool>>& pairs,
              ChunkLayout layout) {
  const int p = int(orders.size());
  std::vector<std::map<std::tuple<char, int, int>, size_t>> index(static_cast<size_t>(p));
  Replay r{std::vector<size_t>(size_t(p), 0), std::vector<std::vector<double>>(size_t(p))};
  for (int s = 0; s < p; ++s) {
    r.end[size_t(s)].assign(orders[size_t(s)].size(), 0);
    for (size_t i = 0; i < orders[size_t(s)].size(); ++i) {
      const ScheduledOp& o = orders[size_t(s)][i];
      index[size_t(s)][{o.kind, o.mb, o.chunk}] = i;
    }
  }
  // When op o's input was sent (0: it needs none), or -1: not yet.
  auto input_at = [&](int s, const ScheduledOp& o) {
    const Link from = receives_from(o.kind, s, o.chunk, p, layout);
    if (from.stage < 0) return 0.0;
    const auto it = index[size_t(from.stage)].find({o.kind, o.mb, from.chunk});
    if (it == index[size_t(from.stage)].end() || it->second >= r.reached[size_t(from.stage)]) return -1.0;
    return r.end[size_t(from.stage)][it->second];
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      const std::vector<ScheduledOp>& order = orders[size_t(s)];
      for (size_t& i = r.reached[size_t(s)]; i < order.size();) {
        const size_t n = pairs[size_t(s)][i] ? 3 : 1;
        double start = i > 0 ? r.end[size_t(s)][i - 1] : 0;
        for (size_t k = i; k < i + n && start >= 0; ++k) {
          const double at = input_at(s, order[k]);
          start = at < 0 ? -1 : std::max(start, at);
        }
        if (start < 0) break;
        for (size_t k = i; k < i + n; ++k) r.end[size_t(s)][k] = start + (n == 3 ? 2 : 1);
        i += n;
        progress = true;
      }
    }
  }
  return r;
}

std::vector<std::vector<bool>> candidate_pairs(const std::vector<std::vector<ScheduledOp>>& orders) {
  std::vector<std::vector<bool>> pairs;
  for (const std::vector<ScheduledOp>& order : orders) {
    pairs.emplace_back(order.size(), false);
    for (size_t i = 0; i < order.size(); ++i)
      if (is_pair(order, i)) pairs.back()[i] = true, i += 2;
  }
  return pairs;
}

// Every rank's pairs (overlapped_pairs, for all stages at once).
std::vector<std::vector<bool>> all_pairs(const std::vector<std::vector<ScheduledOp>>& orders, ChunkLayout layout) {
  std::vector<std::vector<bool>> pairs = candidate_pairs(orders);
  // While the ranks stall, the first stalled rank's pair runs one half after the other; then again.
  for (;;) {
    const std::vector<size_t> reached = replay(orders, pairs, layout).reached;
    size_t stalled = 0;
    while (stalled < orders.size() && reached[stalled] == orders[stalled].size()) ++stalled;
    if (stalled == orders.size()) return pairs;
    std::vector<bool>& mine = pairs[stalled];
    LOOM_CHECK(mine[reached[stalled]], "overlapped_pairs: stage ", stalled,
               "'s order cannot run with the others even one op at a time");
    mine[reached[stalled]] = false;
  }
}

}  // namespace

std::vector<bool> overlapped_pairs(const std::vector<std::vector<ScheduledOp>>& orders, int stage,
                                   ChunkLayout layout) {
  LOOM_CHECK(stage >= 0 && stage < int(orders.size()), "overlapped_pairs: stage ", stage, " of ", orders.size());
  return all_pairs(orders, layout)[size_t(stage)];
}

double step_slots(const std::vector<std::vector<ScheduledOp>>& orders, ChunkLayout layout, bool overlap) {
  std::vector<std::vector<bool>> pairs;
  if (overlap) pairs = all_pairs(orders, layout);
  else
    for (const std::vector<ScheduledOp>& order : orders) pairs.emplace_back(order.size(), false);
  const Replay r = replay(orders, pairs, layout);
  double last = 0;
  for (size_t s = 0; s < orders.size(); ++s) {
    LOOM_CHECK(r.reached[s] == orders[s].size(), "step_slots: stage ", s, "'s order cannot run with the others");
    if (!r.end[s].empty()) last = std::max(last, r.end[s].back());
  }
  return last;
}

PairWorker::PairWorker() : thread_([this] { loop(); }) {}

PairWorker::~PairWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void PairWorker::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || job_ != nullptr; });
    if (stop_) return;
    const std::function<void()>* job = job_;
    lock.unlock();
    std::exception_ptr error;
    try {
      OneCoreGuard one_core;
      GradMode::set_enabled(grad_enabled_);  // thread-local: the caller's, for this half
      (*job)();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    job_ = nullptr, error_ = error, done_ = true;
    cv_.notify_all();
  }
}

void PairWorker::run_both(const std::function<void()>& there, const std::function<void()>& here) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &there, done_ = false, error_ = nullptr, grad_enabled_ = GradMode::is_enabled();
  }
  cv_.notify_all();
  std::exception_ptr mine;
  try {
    OneCoreGuard one_core;
    here();
  } catch (...) {
    mine = std::current_exception();  // wait for the worker first: there() uses the caller's locals
  }
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return done_; });
  if (mine) std::rethrow_exception(mine);
  if (error_) std::rethrow_exception(error_);
}

}  // namespace loom::parallel
