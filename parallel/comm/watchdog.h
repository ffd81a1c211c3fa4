// The collective watchdog. A collective that never finishes means the ranks
// disagree about what to run next (one rank skipped an all-reduce, or two
// issued them in different orders); MPI and NCCL would wait forever. A thread
// looks at every group's queue a few times a second - the MPI backend's
// CommQueue thread, the NCCL backend's stream - and when an operation has been
// running longer than LOOM_COLLECTIVE_TIMEOUT seconds (default 300) it prints
// which one this rank is stuck in - group, op, sequence number, bytes - aborts
// that group's communicator (NCCL's kernels would otherwise spin on), and
// aborts the whole job. PyTorch's NCCL watchdog does the same
// (TORCH_NCCL_ASYNC_ERROR_HANDLING, "Watchdog caught collective operation timeout").
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace loom::parallel {
namespace watchdog {

// The operation a queue is inside right now.
struct Running {
  std::string op;       // "all_reduce(sum, float32)"
  uint64_t seq = 0;     // 1 for the group's first operation, 2 for the next, ...
  size_t bytes = 0;
  double seconds = 0;   // since it started running (not since it was queued behind others)
};

// What the watchdog asks of a queue. Called on the watchdog's thread, under
// its lock (so a queue cannot unregister in the middle); must not block.
class Watched {
 public:
  virtual std::optional<Running> running() const = 0;
  virtual const std::string& label() const = 0;  // the group in messages: "world (size 4)"
  // Just before the job is aborted: let go of the stuck operation where the
  // backend can (ncclCommAbort). Best effort; must not block.
  virtual void abort_communication() const {}

 protected:
  ~Watched() = default;
};

// LOOM_COLLECTIVE_TIMEOUT in seconds, or 300 when unset. Error (tensor/numbers.h's shape) outside [0.1, 604800].
double timeout_from_env();

// Starts the watchdog thread (init() does). abort_job(message) must not return.
void start(int world_rank, double timeout_seconds, std::function<void(const std::string&)> abort_job);
void stop();  // finalize() does

// Every queue registers itself for its lifetime.
void watch(const Watched* queue);
void unwatch(const Watched* queue);

}  // namespace watchdog
}  // namespace loom::parallel
