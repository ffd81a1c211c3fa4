// The collective watchdog. A collective that never finishes means the ranks
// disagree about what to run next (one rank skipped an all-reduce, or two
// issued them in different orders); MPI and NCCL would wait forever. A thread
// looks at every group's CommQueue a few times a second, and when an operation
// has been running longer than LOOM_COLLECTIVE_TIMEOUT seconds (default 300)
// it prints which one this rank is stuck in - group, op, sequence number,
// bytes - and aborts the whole job. PyTorch's NCCL watchdog does the same
// (TORCH_NCCL_ASYNC_ERROR_HANDLING, "Watchdog caught collective operation timeout").
#pragma once

#include <functional>
#include <string>

namespace loom::parallel {

class CommQueue;

namespace watchdog {

// LOOM_COLLECTIVE_TIMEOUT in seconds, or 300 when unset. Error if not a positive number.
double timeout_from_env();

// Starts the watchdog thread (init() does). abort_job(message) must not return.
void start(int world_rank, double timeout_seconds, std::function<void(const std::string&)> abort_job);
void stop();  // finalize() does

// Every CommQueue registers itself for its lifetime.
void watch(const CommQueue* queue);
void unwatch(const CommQueue* queue);

}  // namespace watchdog
}  // namespace loom::parallel
