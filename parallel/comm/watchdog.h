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
//
// Before it aborts, it asks every other rank where it is (Peers, answered by
// their watchdog threads, which keep running whatever their ranks are doing):
// a rank that answers but is not in this collective skipped it or ran its
// collectives in another order; a rank that does not answer within a few
// seconds is dead or cannot be reached (its host is down, the link is cut).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
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
  // How many operations have started running (the last one's sequence number); 0 if unknown.
  virtual uint64_t started() const { return 0; }
  // Just before the job is aborted: let go of the stuck operation where the
  // backend can (ncclCommAbort). Best effort; must not block.
  virtual void abort_communication() const {}

 protected:
  ~Watched() = default;
};

// The other ranks, as the watchdog thread sees them (peer_status.h: over MPI).
// Both are called on the watchdog's thread only; state() is this rank's
// answer ("world (size 2): in all_reduce(sum, float32) #7 for 3 s").
class Peers {
 public:
  virtual ~Peers() = default;
  // Answers the questions other ranks' watchdogs have sent (state() only if
  // one has). Must not block.
  virtual void serve(const std::function<std::string()>& state) = 0;
  // Asks every other rank for its state and waits up to `seconds` (serving
  // meanwhile); returns the diagnosis for the abort message. *busy_peer: some
  // rank answered that it is inside LocalWork (below).
  virtual std::string ask(const std::string& my_state, double seconds, bool* busy_peer = nullptr) = 0;
};

// Work a rank does outside every collective that may outlast the timeout: a
// checkpoint's writes, whose fsync waits for the disk - 14 and 24 s measured
// on a host whose other jobs were writing, while the ranks done with their own
// part of the save waited in the next collective (issue 52's hang at --save
// --export-hf: rank 0 writing the manifest, ranks 2, 4, 6 in the export's pp
// send to it). While one lives, this rank's answer to the others starts with
// kBusy ("busy outside collectives: writing checkpoint ck.safetensors for 21 s"),
// and a rank whose collective is past the timeout waits on - one note, then
// another timeout, at most kBusyExtensions times - instead of aborting: that
// peer is not in another collective order, it is slow. Nestable; any thread.
class LocalWork {
 public:
  explicit LocalWork(std::string what);
  ~LocalWork();
  LocalWork(const LocalWork&) = delete;
  LocalWork& operator=(const LocalWork&) = delete;

 private:
  uint64_t id_;
};
inline constexpr const char* kBusy = "busy outside collectives: ";
inline constexpr int kBusyExtensions = 10;

// LOOM_COLLECTIVE_TIMEOUT in seconds, or 300 when unset. Error (tensor/numbers.h's shape) outside [1, 604800].
double timeout_from_env();

// Starts the watchdog thread (init() does). abort_job(message) must not return.
// peers may be null (no one to ask); the watchdog owns it.
void start(int world_rank, double timeout_seconds, std::function<void(const std::string&)> abort_job,
           std::unique_ptr<Peers> peers = nullptr);
void stop();  // finalize() does

// Every queue registers itself for its lifetime.
void watch(const Watched* queue);
void unwatch(const Watched* queue);

}  // namespace watchdog
}  // namespace loom::parallel
