#include "parallel/trace/trace.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <mutex>
#include <utility>
#include <vector>

#include "parallel/trace/clock_sync.h"
#include "tensor/error.h"
#include "tensor/write_file.h"

namespace loom::parallel::trace {

namespace {

struct Event {
  std::string name;
  double start_us, dur_us;
  Track track;
  SpanArgs args;
};

// A span on a GPU track, as two events until write() reads their times.
struct GpuEvent {
  std::string name;
  cuda::TimingEvent begin, end;
  Track track;
};

std::atomic<bool> g_enabled{false};
std::chrono::steady_clock::time_point g_t0;
ClockOffset g_clock;  // how this rank's zero was moved onto rank 0's, and how well
std::mutex g_mutex;
std::vector<Event> g_events;
// set_gpu(): the traced GPU, and its base event with the host time it stands for.
std::atomic<bool> g_gpu{false};
Device g_gpu_device;
cuda::TimingEvent g_gpu_base;
double g_gpu_base_us = 0;
std::vector<GpuEvent> g_gpu_events;

// Under g_mutex: gives back every pending GPU event and the base.
void drop_gpu_events() {
  for (GpuEvent& e : g_gpu_events) {
    cuda::destroy_timing_event(e.begin);
    cuda::destroy_timing_event(e.end);
  }
  g_gpu_events.clear();
}

// Under g_mutex: the pending GPU spans as host-clock events (waits for the
// GPU to reach them). A span whose times cannot be read is left out: write()
// is collective, and one rank throwing here would leave the others waiting.
void resolve_gpu_events() {
  for (GpuEvent& e : g_gpu_events) {
    try {
      const double b = g_gpu_base_us + 1000.0 * cuda::elapsed_ms(g_gpu_base, e.begin);
      const double f = g_gpu_base_us + 1000.0 * cuda::elapsed_ms(g_gpu_base, e.end);
      g_events.push_back({e.name, b, f - b, e.track, {}});
    } catch (const std::exception&) {
    }
  }
  drop_gpu_events();
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

// ", \"args\": {...}" for an event that carries any, else "".
std::string json_args(const SpanArgs& a) {
  std::string o;
  if (a.bytes >= 0) o += "\"bytes\": " + std::to_string(a.bytes);
  if (!a.what.empty()) o += (o.empty() ? "" : ", ") + std::string("\"for\": \"") + json_escape(a.what) + "\"";
  return o.empty() ? o : ", \"args\": {" + o + "}";
}

}  // namespace

void start(ProcessGroup& world) {
  world.barrier();
  g_t0 = std::chrono::steady_clock::now();
  // What the barrier left between this clock and rank 0's (clock_sync.h).
  g_clock = measure_offset_to_rank0([] {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - g_t0).count();
  });
  g_t0 -= std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double, std::micro>(g_clock.offset_us));
  std::lock_guard<std::mutex> lock(g_mutex);
  g_events.clear();
  g_gpu = false;
  drop_gpu_events();
  cuda::destroy_timing_event(g_gpu_base);
  g_enabled = true;
}

bool enabled() { return g_enabled.load(std::memory_order_relaxed); }

void set_gpu(const Device& d) {
  LOOM_CHECK(d.is_cuda(), "trace::set_gpu: ", d.str(), " is not a GPU");
  if (!enabled()) return;
  cuda::synchronize(d);  // an idle stream: the base event completes as soon as it is recorded
  std::lock_guard<std::mutex> lock(g_mutex);
  cuda::destroy_timing_event(g_gpu_base);
  g_gpu_base_us = now_us();
  g_gpu_base = cuda::record_timing_event(d);
  g_gpu_device = d;
  g_gpu = true;
}

bool gpu_enabled() { return enabled() && g_gpu.load(std::memory_order_relaxed); }
Device gpu_device() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_gpu_device;
}

GpuSpan::GpuSpan(const std::string& name, Track track) : track_(track) {
  if (!gpu_enabled()) return;
  device_ = gpu_device();
  name_ = name;
  begin_ = cuda::record_timing_event(device_);
}

GpuSpan::GpuSpan(const std::string& name, Track track, const Device& device, void* stream)
    : track_(track), stream_(stream) {
  if (!gpu_enabled() || !(device == gpu_device())) return;
  device_ = device;
  name_ = name;
  begin_ = cuda::record_timing_event(device_, stream_);
}

GpuSpan::~GpuSpan() {
  if (!begin_.event) return;
  cuda::TimingEvent end;
  try {  // a destructor must not throw: a span whose end cannot be recorded is dropped
    end = cuda::record_timing_event(device_, stream_);
  } catch (const std::exception&) {
    cuda::destroy_timing_event(begin_);
    return;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_gpu) {  // tracing restarted since the span began
    cuda::destroy_timing_event(begin_);
    cuda::destroy_timing_event(end);
    return;
  }
  g_gpu_events.push_back({name_, begin_, end, track_});
}

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - g_t0).count();
}

void record(const std::string& name, double start_us, double end_us, Track track, SpanArgs args) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_events.push_back({name, start_us, end_us - start_us, track, std::move(args)});
}

namespace {
thread_local std::string t_comm_label;
}  // namespace

CommLabel::CommLabel(const std::string& what) : previous_(std::exchange(t_comm_label, what)) {}

CommLabel::~CommLabel() { t_comm_label = std::move(previous_); }

const std::string& comm_label() { return t_comm_label; }

Span::Span(std::string name, Track track) : name_(std::move(name)), track_(track) {
  if (!enabled()) return;
  start_ = now_us();
  if (track_ == kCompute) gpu_.emplace(name_, kGpuCompute);
}

Span::~Span() {
  if (start_ >= 0) record(name_, start_, now_us(), track_);
}

void write(ProcessGroup& world, const std::string& path) {
  // This rank's events as JSON objects, one per line.
  std::string mine;
  bool gpu_tracks = false;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    gpu_tracks = g_gpu;
    resolve_gpu_events();
    char buf[160];
    uint32_t slices = 0;  // async slices so far on this rank
    for (const Event& e : g_events) {
      const std::string head = ",\n{\"name\": \"" + json_escape(e.name) + "\", ";
      if (e.track == kLaunched) {  // an async slice: a begin and an end; the id is unique in the file
        const int64_t id = (int64_t(world.rank()) << 32) | ++slices;
        for (bool begin : {true, false}) {
          std::snprintf(buf, sizeof buf, "\"cat\": \"launch to completion\", \"ph\": \"%s\", \"id\": %lld, "
                        "\"ts\": %.3f, \"pid\": %d, \"tid\": %d", begin ? "b" : "e", (long long)id,
                        begin ? e.start_us : e.start_us + e.dur_us, world.rank(), int(kComm));
          mine += head + buf + (begin ? json_args(e.args) : "") + "}";
        }
        continue;
      }
      std::snprintf(buf, sizeof buf, "\"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, \"tid\": %d", e.start_us,
                    e.dur_us, world.rank(), int(e.track));
      mine += head + buf + json_args(e.args) + "}";
    }
    g_events.clear();
    // The row's label in Perfetto: how well this rank's clock sits on rank 0's.
    std::snprintf(buf, sizeof buf, "\"ph\": \"M\", \"pid\": %d, \"args\": {\"labels\": \"clock: rank 0's %+.1f us, "
                  "within +-%.1f us\"}}", world.rank(), g_clock.offset_us, g_clock.error_us);
    mine += std::string(",\n{\"name\": \"process_labels\", ") + buf;
  }
  // Gather the texts: lengths first, then the bytes padded to the longest (all_gather needs equal sizes).
  Tensor len = from_vector(std::vector<int64_t>{int64_t(mine.size())});
  Tensor lens = zeros({world.size()}, kInt64);
  world.all_gather(lens, len);
  std::vector<int64_t> sizes = lens.to_vector<int64_t>();
  int64_t longest = 1;
  for (int64_t s : sizes) longest = std::max(longest, s);
  std::vector<int32_t> chars(size_t(longest), 0);
  for (size_t i = 0; i < mine.size(); ++i) chars[i] = int32_t(static_cast<unsigned char>(mine[i]));
  Tensor all = zeros({world.size() * longest}, kInt32);
  world.all_gather(all, from_vector(chars));
  if (world.rank() != 0) return;

  std::vector<int32_t> bytes = all.to_vector<int32_t>();
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  out += "{\"name\": \"trace\", \"ph\": \"M\", \"pid\": 0, \"args\": {}}";
  for (int r = 0; r < world.size(); ++r) {
    out += ",\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(r) +
           ", \"args\": {\"name\": \"rank " + std::to_string(r) + "\"}}";
    out += ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + std::to_string(r) +
           ", \"tid\": 0, \"args\": {\"name\": \"compute\"}}";
    out += ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + std::to_string(r) +
           ", \"tid\": 1, \"args\": {\"name\": \"communication\"}}";
    if (gpu_tracks) {  // every rank of a GPU run has them (rank 0 stands for the others)
      out += ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + std::to_string(r) +
             ", \"tid\": 3, \"args\": {\"name\": \"GPU compute stream\"}}";
      out += ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + std::to_string(r) +
             ", \"tid\": 4, \"args\": {\"name\": \"GPU communication stream\"}}";
    }
    for (int64_t i = 0; i < sizes[size_t(r)]; ++i) out += char(bytes[size_t(r * longest + i)]);
  }
  out += "\n]}\n";
  write_file_atomically(path, out, "trace");
}

}  // namespace loom::parallel::trace
