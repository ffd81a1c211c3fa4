#include "parallel/trace/trace.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <utility>
#include <vector>

#include "tensor/write_file.h"

namespace loom::parallel::trace {

namespace {

struct Event {
  std::string name;
  double start_us, dur_us;
  Track track;
};

std::atomic<bool> g_enabled{false};
std::chrono::steady_clock::time_point g_t0;
std::mutex g_mutex;
std::vector<Event> g_events;

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

}  // namespace

void start(ProcessGroup& world) {
  world.barrier();
  g_t0 = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(g_mutex);
  g_events.clear();
  g_enabled = true;
}

bool enabled() { return g_enabled.load(std::memory_order_relaxed); }

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - g_t0).count();
}

void record(const std::string& name, double start_us, double end_us, Track track) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_events.push_back({name, start_us, end_us - start_us, track});
}

Span::Span(std::string name, Track track) : name_(std::move(name)), track_(track) {
  if (enabled()) start_ = now_us();
}

Span::~Span() {
  if (start_ >= 0) record(name_, start_, now_us(), track_);
}

void write(ProcessGroup& world, const std::string& path) {
  // This rank's events as JSON objects, one per line.
  std::string mine;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    char buf[160];
    uint32_t slices = 0;  // async slices so far on this rank
    for (const Event& e : g_events) {
      const std::string head = ",\n{\"name\": \"" + json_escape(e.name) + "\", ";
      if (e.track == kLaunched) {  // an async slice: a begin and an end; the id is unique in the file
        const int64_t id = (int64_t(world.rank()) << 32) | ++slices;
        for (bool begin : {true, false}) {
          std::snprintf(buf, sizeof buf, "\"cat\": \"launch to completion\", \"ph\": \"%s\", \"id\": %lld, "
                        "\"ts\": %.3f, \"pid\": %d, \"tid\": %d}", begin ? "b" : "e", (long long)id,
                        begin ? e.start_us : e.start_us + e.dur_us, world.rank(), int(kComm));
          mine += head + buf;
        }
        continue;
      }
      std::snprintf(buf, sizeof buf, "\"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, \"tid\": %d}", e.start_us,
                    e.dur_us, world.rank(), int(e.track));
      mine += head + buf;
    }
    g_events.clear();
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
    for (int64_t i = 0; i < sizes[size_t(r)]; ++i) out += char(bytes[size_t(r * longest + i)]);
  }
  out += "\n]}\n";
  write_file_atomically(path, out, "trace");
}

}  // namespace loom::parallel::trace
