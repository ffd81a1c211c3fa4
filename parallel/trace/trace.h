// A timeline trace of a training run, viewable in Perfetto (ui.perfetto.dev) or
// chrome://tracing: one row per rank, and per rank one track for compute
// (forward, backward, optimizer step, waits), one for communication (each
// collective while it runs, p2p transfers) and async slices for each
// collective from launch to completion (a bucket's all-reduce from the moment
// backward hands it over). Seeing the
// communication track busy *while* the compute track is still in backward is
// what overlap looks like.
//
//   trace::start(world);                 // collective: aligns the ranks' clocks
//   { trace::Span s("forward"); ... }    // a span on this thread's track
//   trace::write(world, "trace.json");   // collective: rank 0 writes the file
//
// Recording is off until start(); then it costs one clock read and one vector
// push per span. Thread-safe (communication threads record too).
#pragma once

#include <string>

#include "parallel/comm/process_group.h"

namespace loom::parallel::trace {

// kComm: an operation while the communication thread runs it. kLaunched: the
// same operation from its launch (the async call, e.g. a bucket's all-reduce
// from the backward hook) to its completion, written as an async slice, since
// these overlap: a bucket launched while an earlier one still runs waits in
// the queue, and that wait is part of what backward must hide.
enum Track : int { kCompute = 0, kComm = 1, kLaunched = 2 };

// Collective over `world`: a barrier, then every rank's clock starts at zero.
// On one machine the ranks share CLOCK_MONOTONIC anyway; the barrier keeps
// the rows aligned to within the barrier's latency across machines too.
void start(ProcessGroup& world);
bool enabled();

// Microseconds since start() on this rank.
double now_us();
// A complete span [start_us, end_us) named e.g. "F3", "all_reduce bucket 2".
void record(const std::string& name, double start_us, double end_us, Track track = kCompute);

// RAII: records [construction, destruction) on `track` when tracing is enabled.
class Span {
 public:
  explicit Span(std::string name, Track track = kCompute);
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  std::string name_;
  Track track_;
  double start_ = -1;
};

// Collective over `world`: gathers every rank's spans to rank 0, which writes
// one Chrome-trace JSON file (written to path.tmp, then renamed). Clears the
// recorded spans.
void write(ProcessGroup& world, const std::string& path);

}  // namespace loom::parallel::trace
