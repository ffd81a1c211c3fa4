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
//
// On a GPU the host's spans say when work was *launched*; the GPU runs it
// later. trace::set_gpu(d) (train_gpt --device cuda --trace) adds two tracks
// per rank, on the GPU's clock: "GPU compute stream" mirrors each compute
// Span with a CUDA event pair on loom's stream of d, and "GPU communication
// stream" holds every NCCL operation, timed by an event pair on its group's
// stream. A bucket's all-reduce running under the GPU's backward is overlap
// as the GPU sees it. The events are turned into this rank's microseconds at
// write(), against a base event recorded by set_gpu() once d's stream had
// drained (so the GPU's clock and the host's are aligned to within the few
// microseconds that event takes).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "parallel/comm/process_group.h"
#include "tensor/cuda/cuda.h"

namespace loom::parallel::trace {

// kComm: an operation while the communication thread runs it. kLaunched: the
// same operation from its launch (the async call, e.g. a bucket's all-reduce
// from the backward hook) to its completion, written as an async slice, since
// these overlap: a bucket launched while an earlier one still runs waits in
// the queue, and that wait is part of what backward must hide.
// kGpuCompute, kGpuComm: spans on the GPU's clock (set_gpu).
enum Track : int { kCompute = 0, kComm = 1, kLaunched = 2, kGpuCompute = 3, kGpuComm = 4 };

// Collective over `world` (every rank of the job: the ping-pongs run on
// MPI_COMM_WORLD): a barrier, then every rank's clock starts at zero,
// moved onto rank 0's by a few ping-pongs (clock_sync.h: across machines the
// barrier alone leaves up to a one-way latency between rows). Each rank's
// row is labelled with its offset and how accurate it is ("within +-40 us").
void start(ProcessGroup& world);
bool enabled();

// Microseconds since start() on this rank.
double now_us();
// What a span carries besides its name and times, written as the event's
// "args" in the file: a collective's exact bytes (its name rounds them down to
// KiB), and what it was launched for ("unit 2": ZeRO-3's gathers, CommLabel).
struct SpanArgs {
  int64_t bytes = -1;  // -1: not written
  std::string what;    // empty: not written
};
// A complete span [start_us, end_us) named e.g. "F3", "all_reduce bucket 2".
void record(const std::string& name, double start_us, double end_us, Track track = kCompute, SpanArgs args = {});

// RAII, on the thread that launches communication: every collective submitted
// while it lives carries `what` in the trace (SpanArgs::what), so a reader can
// tell which unit an all-gather fills. Nests.
class CommLabel {
 public:
  explicit CommLabel(const std::string& what);
  ~CommLabel();
  CommLabel(const CommLabel&) = delete;
  CommLabel& operator=(const CommLabel&) = delete;

 private:
  std::string previous_;
};
const std::string& comm_label();  // this thread's label now ("" outside every CommLabel)

// A compute span opened in one hook and closed in another (a layer's forward
// pre-hook and its forward hook): open() notes the time, close() records the
// span if one is open. Nothing while tracing is off.
class OpenSpan {
 public:
  void open() { start_ = enabled() ? now_us() : -1; }
  void close(const std::string& name) {
    if (start_ >= 0) record(name, start_, now_us(), kCompute);
    start_ = -1;
  }

 private:
  double start_ = -1;
};

// After start(), on a rank whose work runs on GPU d: adds the GPU tracks
// (waits once for d's stream to drain). Off again at the next start().
void set_gpu(const Device& d);
bool gpu_enabled();
Device gpu_device();

// RAII: a span on a GPU track, between CUDA events recorded on a stream of
// the traced GPU at construction and at destruction (when the GPU reaches
// them, not when the host passes). Nothing while GPU tracing is off.
class GpuSpan {
 public:
  // On loom's stream of the traced GPU.
  GpuSpan(const std::string& name, Track track);
  // On `stream` (a cudaStream_t of device, e.g. an NCCL group's); nothing
  // unless device is the traced GPU.
  GpuSpan(const std::string& name, Track track, const Device& device, void* stream);
  ~GpuSpan();
  GpuSpan(const GpuSpan&) = delete;
  GpuSpan& operator=(const GpuSpan&) = delete;

 private:
  std::string name_;
  Track track_;
  Device device_;
  void* stream_ = nullptr;
  cuda::TimingEvent begin_;
};

// RAII: records [construction, destruction) on `track` when tracing is
// enabled; a compute span also on the GPU compute track after set_gpu().
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
  std::optional<GpuSpan> gpu_;  // set_gpu(): the same span on the GPU's stream
};

// Collective over `world`: gathers every rank's spans to rank 0, which writes
// one Chrome-trace JSON file (written to path.tmp, then renamed). Clears the
// recorded spans.
void write(ProcessGroup& world, const std::string& path);

}  // namespace loom::parallel::trace
