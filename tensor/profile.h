// Where a CPU step's time goes, op by op (bench_gpt_step --profile, bench/gpt_step.cpp; issue 47).
//
// An op opens a profile::Scope on entry; while profiling is on, the scope adds
// the op's *exclusive* wall time (its own, less the scopes opened inside it:
// linear's time excludes the copy it makes of a strided input, which counts
// as "copy"), one call, and the flops and bytes the caller says the op does,
// under its name. A name may carry a shape ("linear fwd 1024x384x1152"), so
// GEMMs are told apart by shape. Off by default: a closed scope costs one
// load of a flag. Only the thread that called start() records (the math
// threads run inside an op's scope; a communication thread's ops are not a
// step's compute). Beside the wall time, the recording thread's CPU time:
// on a busy machine (a build beside the benchmark) the wall time includes the
// moments the thread waited for a core, the CPU time does not, so at one
// math thread the CPU time is what the op costs on an idle machine.
//
//   profile::start();
//   ... steps ...
//   for (auto& [name, e] : profile::stop()) printf("%s %.3f ms\n", name.c_str(), e.seconds * 1e3);
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace loom::profile {

struct Entry {
  double seconds = 0;      // exclusive wall time
  double cpu_seconds = 0;  // exclusive CPU time of the recording thread
  int64_t calls = 0;
  double flops = 0;  // floating-point operations (a multiply-add is 2)
  double bytes = 0;  // bytes read and written, counted once each
};

void start();                         // clears the totals; this thread records from now on
std::map<std::string, Entry> stop();  // stops recording, returns the totals by name
bool recording();                     // profiling is on and this is the recording thread

class Scope {
 public:
  Scope(const char* name, double flops = 0, double bytes = 0) {
    if (recording()) open(name, flops, bytes);
  }
  // A name built only while recording: Scope s([&] { return shape_name(...); }, ...).
  template <class NameFn, class = decltype(std::string(std::declval<NameFn>()()))>
  Scope(NameFn name, double flops = 0, double bytes = 0) {
    if (recording()) open(name(), flops, bytes);
  }
  ~Scope() {
    if (open_) close();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void open(std::string name, double flops, double bytes);
  void close();

  bool open_ = false;
  std::string name_;
  double flops_ = 0, bytes_ = 0;
  std::chrono::steady_clock::time_point begin_;
  double begin_cpu_ = 0;
  double children_ = 0, children_cpu_ = 0;  // seconds spent in scopes opened inside this one
  Scope* parent_ = nullptr;
};

// This thread's CPU time in seconds (CLOCK_THREAD_CPUTIME_ID).
double thread_cpu_seconds();

// "1024x384x1152": an M x K x N product's name suffix.
std::string shape(int64_t m, int64_t k, int64_t n);

}  // namespace loom::profile
