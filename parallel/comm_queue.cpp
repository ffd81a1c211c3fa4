#include "parallel/comm_queue.h"

#include <chrono>
#include <cstdlib>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "parallel/trace.h"
#include "parallel/watchdog.h"
#include "tensor/grad_mode.h"

namespace loom::parallel {

namespace {

using Clock = std::chrono::steady_clock;

// Completion of one queued operation: a flag, the error if it failed, and a
// condition variable for wait().
class QueueWork final : public Work {
 public:
  void wait() override {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return done_; });
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
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

// MPI waits by busy-polling. While this thread waits for a peer that has not
// reached the collective yet, it would take a core from this rank's compute
// thread whenever there is no idle core (2 ranks on 2 cores: every bucket
// launched during backward would slow backward down). So the communication
// thread runs at a low priority (nice LOOM_COMM_THREAD_NICE, default 19): it
// gets a core when one is idle - the compute thread waiting, or a spare core -
// and hardly any while compute needs them all. Linux nice values are per thread.
// (On 2 cores, dp 2, a 4-layer GPT: the exposed communication of the bucketed
// wrapper fell from ~9-12 ms at nice 0 to ~4-5 ms at nice 19.) The price: on a
// machine busy with other programs the thread gets little CPU; set
// LOOM_COMM_THREAD_NICE=0 there.
void lower_thread_priority() {
  const char* env = std::getenv("LOOM_COMM_THREAD_NICE");
  int nice = env && *env ? std::atoi(env) : 19;
  setpriority(PRIO_PROCESS, id_t(syscall(SYS_gettid)), nice);  // best effort: ignore failure
}

}  // namespace

struct CommQueue::Task {
  std::string op;
  uint64_t seq;
  size_t bytes;
  std::function<void()> fn;
  std::shared_ptr<QueueWork> work = std::make_shared<QueueWork>();
  Clock::time_point start;
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

std::optional<CommQueue::Running> CommQueue::running() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!current_) return std::nullopt;
  double s = std::chrono::duration<double>(Clock::now() - current_->start).count();
  return Running{current_->op, current_->seq, current_->bytes, s};
}

void CommQueue::loop() {
  // Communication never records autograd graphs, and may write into leaf
  // tensors (a broadcast of parameters).
  NoGradGuard no_grad;
  lower_thread_priority();
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
    }
    std::exception_ptr error;
    const double t0 = trace::enabled() ? trace::now_us() : 0;
    try {
      task->fn();
    } catch (...) {
      error = std::current_exception();
    }
    // The timeline's communication track: each collective from the moment this
    // thread starts it to its end (p2p transfers record their own spans).
    if (trace::enabled() && task->op.rfind("send", 0) != 0 && task->op.rfind("recv", 0) != 0)
      trace::record(task->op + " " + label_ + " #" + std::to_string(task->seq) + " (" +
                        std::to_string(task->bytes / 1024) + " KiB)",
                    t0, trace::now_us(), trace::kComm);
    task->fn = nullptr;  // drop the tensors it captured before signalling
    {
      std::lock_guard<std::mutex> lock(mutex_);
      current_ = nullptr;
    }
    task->work->finish(error);
  }
}

}  // namespace loom::parallel
