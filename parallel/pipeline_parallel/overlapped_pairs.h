// DualPipeV's overlap, run for real (--overlap-pairs; DeepSeek-V3 report,
// arXiv 2412.19437, section 3.2.1; deepseek-ai/DualPipe's
// _forward_backward_chunk): the two halves of a pair - the forward of one
// micro-batch on one chunk, the full backward (B, then W) of another on the
// other chunk (dualpipev_schedule.h) - compute at the same time, the F on a
// second host thread, B and W on the calling one, each on one core.
//
// Around them, DualPipe's order of communication (schedule_table.cpp):
//   receive F's activation, receive B's output gradient      calling thread, MPI
//   F  ||  B, W                                              two threads, no MPI on the second
//   post F's send, post B's send                             calling thread, MPI
// so each half's transfers are done before, or go on during, the other's
// compute. W's data-parallel hooks fire on the calling thread, as without
// the overlap: the dp group sees its reductions in the same order.
//
// The same bits as one after the other, because the halves share nothing they
// write: F reads chunk c's weights and writes its own activations; B and W
// read chunk 1 - c's and write their .grad (the tied wte, on both chunks of
// stage 0, is read by F and accumulated into by W: its data and its .grad are
// apart). What the process does share, and how it is kept apart:
//   grad mode, a backward's GraphTask      thread-local (the worker copies the caller's grad mode)
//   node sequence numbers                  one atomic counter: a graph's own nodes keep their order
//   dropout generators, recompute state    one per module: the halves run other modules
//   the allocator's counters, the trace    under a mutex
//   the runner's in-flight activations     under a mutex (microbatch_runner.h); the op log too
//   the math threads (OpenMP)              each half runs its loops' chunks - --threads' split - in
//                                          turn on its own thread (OneCoreGuard, tensor/parallel.h): one core each
//                                          at --threads 2, and no GEMM split changes its bits
// What cannot overlap, refused before training (train/checks.cpp): anything
// that talks inside a chunk - tensor, sequence, context and expert
// parallelism, ZeRO-3's gathers, --overlap-param-gather's waits - would post
// collectives on one group from two threads in an order that differs across
// ranks.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "parallel/pipeline_parallel/partition.h"
#include "parallel/pipeline_parallel/pipeline_schedule.h"

namespace loom::parallel {

// For each op of `stage`'s order: true where ops i, i + 1, i + 2 are a pair -
// F of one chunk, then B and W of a micro-batch on the other - that runs
// overlapped. A pair receives both inputs before sending either output, so
// one whose B's gradient waits (through other ranks) for its own F's output,
// or for another pair that waits for it, would stall: every rank's orders are
// run with each pair as one step, and while they stall the first stalled
// rank's pair runs one half after the other (none in DualPipeV's tables: a
// chain from a rank back to it through the V passes that rank in between).
std::vector<bool> overlapped_pairs(const std::vector<std::vector<ScheduledOp>>& orders, int stage,
                                   ChunkLayout layout);

// The step's length in slots, every op one slot (F = B = W on a chunk) and
// transfers free, one after the other (overlap false) or with the pairs
// overlapped - a pair two slots, F beside B then W. What the overlap should
// save (bench/README.md compares it with sleeping stages).
double step_slots(const std::vector<std::vector<ScheduledOp>>& orders, ChunkLayout layout, bool overlap);

// The second host thread of the pairs: it lives for a schedule.
class PairWorker {
 public:
  PairWorker();
  ~PairWorker();
  PairWorker(const PairWorker&) = delete;
  PairWorker& operator=(const PairWorker&) = delete;

  // Runs there() on the worker and here() on the calling thread, at the same
  // time, each on one core; returns when both are done, rethrowing the
  // calling thread's exception, else the worker's.
  void run_both(const std::function<void()>& there, const std::function<void()>& here);

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable cv_;
  const std::function<void()>* job_ = nullptr;  // set: the worker runs it
  bool grad_enabled_ = true, done_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: started once the rest exists
};

}  // namespace loom::parallel
