#include "parallel/comm/comm_queue.h"

#include <chrono>
#include <exception>
#include <utility>

#include "parallel/trace/trace.h"
#include "parallel/comm/watchdog.h"
#include "tensor/grad_mode.h"

namespace loom::parallel {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

// Completion of one queued operation: a flag, the error if it failed, and a
// condition variable for wait(). A thread blocked in wait() is counted in the
// queue's Waiters, so the operation knows it may poll flat out.
class CommQueue::QueueWork final : public Work {
 public:
  explicit QueueWork(std::shared_ptr<Waiters> waiters) : waiters_(std::move(waiters)) {}
  void wait() override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!done_) {
      add_waiter(+1);
      cv_.wait(lock, [&] { return done_; });
      add_waiter(-1);
    }
    if (error_) std::rethrow_exception(error_);
  }
  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }
  void finish(std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
      error_ = std::move(error);
    }
    cv_.notify_all();
  }

 private:
  void add_waiter(int n) {
    {
      std::lock_guard<std::mutex> lock(waiters_->mutex);
      waiters_->count += n;
    }
    waiters_->cv.notify_all();  // ends the queue thread's nap()
  }

  std::shared_ptr<Waiters> waiters_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

struct CommQueue::Task {
  std::string op;
  uint64_t seq;
  size_t bytes;
  std::function<void()> fn;
  std::shared_ptr<QueueWork> work;
  Clock::time_point start;
  double launched_us = -1;  // trace clock at submit(), when tracing
  std::string label;        // the submitting thread's trace::CommLabel, when tracing
};

CommQueue::CommQueue(std::string label) : label_(std::move(label)) {
  thread_ = std::thread([this] { loop(); });
  watchdog::watch(this);
}

CommQueue::~CommQueue() {
  watchdog::unwatch(this);
  shutdown();
}

std::shared_ptr<Work> CommQueue::submit(std::string op, size_t bytes, std::function<void()> fn) {
  auto task = std::make_shared<Task>();
  task->op = std::move(op);
  task->bytes = bytes;
  task->fn = std::move(fn);
  task->work = std::make_shared<QueueWork>(waiters_);
  if (trace::enabled()) task->launched_us = trace::now_us(), task->label = trace::comm_label();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    LOOM_CHECK(!stopping_, task->op, ": process group ", label_, " has been shut down (loom::parallel::finalize)");
    task->seq = next_seq_++;
    tasks_.push_back(task);
  }
  cv_.notify_one();
  return task->work;
}

void CommQueue::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

bool CommQueue::stopping() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stopping_;
}

bool CommQueue::awaited() const {
  std::lock_guard<std::mutex> lock(waiters_->mutex);
  return waiters_->count > 0;
}

void CommQueue::nap(std::chrono::microseconds d) const {
  std::unique_lock<std::mutex> lock(waiters_->mutex);
  waiters_->cv.wait_for(lock, d, [&] { return waiters_->count > 0; });
}

std::optional<CommQueue::Running> CommQueue::running() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!current_) return std::nullopt;
  double s = std::chrono::duration<double>(Clock::now() - current_->start).count();
  return Running{current_->op, current_->seq, current_->bytes, s};
}

uint64_t CommQueue::started() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return started_;
}

void CommQueue::loop() {
  // Communication never records autograd graphs, and may write into leaf
  // tensors (a broadcast of parameters).
  NoGradGuard no_grad;
  for (;;) {
    std::shared_ptr<Task> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, and everything queued has run
      task = std::move(tasks_.front());
      tasks_.pop_front();
      task->start = Clock::now();
      current_ = task;
      started_ = task->seq;
    }
    std::exception_ptr error;
    const double t0 = trace::enabled() ? trace::now_us() : 0;
    try {
      task->fn();
    } catch (...) {
      error = std::current_exception();
    }
    // The timeline's communication track: each collective from the moment this
    // thread starts it to its end, and from its launch to its end (p2p
    // transfers record their own spans).
    if (trace::enabled() && task->op.rfind("send", 0) != 0 && task->op.rfind("recv", 0) != 0) {
      const std::string name = task->op + " " + label_ + " #" + std::to_string(task->seq) + " (" +
                               std::to_string(task->bytes / 1024) + " KiB)";
      const double end = trace::now_us();
      const trace::SpanArgs args{int64_t(task->bytes), task->label};  // the exact bytes, and what it was for
      trace::record(name, t0, end, trace::kComm, args);
      if (task->launched_us >= 0) trace::record(name, task->launched_us, end, trace::kLaunched, args);
    }
    task->fn = nullptr;  // drop the tensors it captured before signalling
    {
      std::lock_guard<std::mutex> lock(mutex_);
      current_ = nullptr;
    }
    task->work->finish(error);
  }
}

}  // namespace loom::parallel
