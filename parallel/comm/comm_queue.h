// CommQueue: one thread that runs a process group's communication in FIFO
// order - the CPU analogue of the CUDA stream an NCCL group launches on. The
// caller submits an operation and gets a Work back at once; while the queue's
// thread sits inside MPI, the caller's thread keeps computing (the overlap
// bucketed data parallelism is built on). The collective watchdog
// (watchdog.h) looks at what each queue is running.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "parallel/comm/process_group.h"
#include "parallel/comm/watchdog.h"

namespace loom::parallel {

class CommQueue final : public watchdog::Watched {
 public:
  // label names the group in watchdog messages: "world (size 4)".
  explicit CommQueue(std::string label);
  ~CommQueue();  // = shutdown()
  CommQueue(const CommQueue&) = delete;
  CommQueue& operator=(const CommQueue&) = delete;

  // Queues fn behind everything submitted before. op and bytes describe it for
  // the watchdog ("all_reduce", 4096). An exception thrown by fn is stored in
  // the Work and rethrown by wait().
  std::shared_ptr<Work> submit(std::string op, size_t bytes, std::function<void()> fn);

  // Runs what is queued, then stops the thread. Later submits throw.
  void shutdown();
  bool stopping() const;  // shutdown() has begun (for operations that could wait forever)

  // The operation the thread is inside right now, if any (for the watchdog).
  using Running = watchdog::Running;
  std::optional<Running> running() const override;
  const std::string& label() const override { return label_; }
  uint64_t started() const override;

  // For an operation's body, on the queue's thread: true while some thread is
  // blocked in wait() on one of this queue's operations. That thread's core is
  // idle then, so communication may poll flat out (process_group_mpi.cpp).
  bool awaited() const;
  // Sleeps for up to d, waking as soon as some thread starts waiting.
  void nap(std::chrono::microseconds d) const;

 private:
  struct Task;
  class QueueWork;
  void loop();

  // Threads blocked in wait() on this queue's Works (shared: a Work may outlive the queue).
  struct Waiters {
    std::mutex mutex;
    std::condition_variable cv;
    int count = 0;
  };

  std::string label_;
  std::shared_ptr<Waiters> waiters_ = std::make_shared<Waiters>();
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Task>> tasks_;
  std::shared_ptr<Task> current_;  // the task being run (null when idle)
  uint64_t next_seq_ = 1;
  uint64_t started_ = 0;  // the seq of the last task the thread took
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace loom::parallel
