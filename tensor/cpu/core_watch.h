// Whether to wake the math threads now: not while other programs keep busy
// the cores they would need (a browser, a build, another rank of this job).
//
// On a 2-core laptop with one core busy, --threads 2 ran the main job 2.4-19x
// slower than --threads 1 (issue 34): the second math thread waited for a
// core the other program held, and every parallel loop waited for it. Idle
// threads that sleep (OMP_WAIT_POLICY=passive) fixed the busy case but cost
// the quiet machine its speed (4.59 s against 2.90 s spinning): waking a
// sleeping thread costs microseconds, and the main job runs thousands of
// short loops. So loom measures instead of guessing: every 100 ms at most,
// the calling thread reads how busy this process's cores were since the last
// look (/proc/stat, less this process's own time from /proc/self/stat), and
// parallel loops wake the other threads only while the cores they need are
// free. Otherwise the calling thread runs the same chunks one after another.
//
// The chunks do not change, only who runs them: a loop split for 2 threads
// is split the same way when one thread runs both halves, so the numbers are
// bit-identical either way (cpu/parallel.h; the GEMM split matters: gemm.h).
//
// LOOM_WAKE_THREADS=always / never in the environment fixes the answer (the
// benchmark and the tests compare the two); auto (the default) measures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::cpu {

// True when the parallel loops may wake threads - 1 other math threads now.
bool wake_math_threads(int threads);

// LOOM_WAKE_THREADS's choice, which set_wake overrides (tests, benchmarks).
enum class Wake { kAuto, kAlways, kNever };
void set_wake(Wake wake);

// The rule, apart from its measurement: other programs kept others_busy of
// the ncores cores this process may run on busy; wake when the cores left
// hold all our threads, give or take half a core.
inline bool cores_free_for(double others_busy, int ncores, int threads) {
  return double(ncores) - others_busy >= double(threads) - 0.5;
}

// Busy and total ticks of the CPUs listed in cpus (or of all, the "cpu"
// line, when cpus is empty) from the text of /proc/stat. Busy is everything
// but idle and iowait.
struct CpuTicks {
  uint64_t busy = 0, total = 0;
};
CpuTicks parse_proc_stat(const std::string& text, const std::vector<int>& cpus);

// utime + stime, the ticks this process ran, from the text of /proc/self/stat
// (fields 14 and 15, counted after the ")" that ends the program's name).
uint64_t parse_self_ticks(const std::string& text);

}  // namespace loom::cpu
