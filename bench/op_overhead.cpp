// bench_op_overhead: the fixed cost of one recorded op, with the math made
// negligible (64 floats). This is the framework's own overhead: allocating the
// output (TensorImpl + Storage), checking dtypes/devices, setting up the
// elementwise loop, and recording the autograd node with its edges.
//
// Rows:
//   raw ops::add                 tensor layer only (no autograd anywhere)
//   a + b, NoGradGuard           the differentiable op when nothing is recorded
//   a + b, recorded              a and b require grad: one node per op
//   chain of 16 + backward       16 recorded adds then backward, per op:
//                                forward + its share of the engine's work
//
// Usage: bench_op_overhead [--quick]
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <cstring>
#include <functional>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "tensor/grad_mode.h"

using namespace loom;

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kTargetUs = 2.0;

// CPU time of this thread: unlike wall time it does not count the time the
// thread waits for a core, so it stays meaningful on a busy machine.
double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Runs body(iters) `repeats` times; microseconds per op: best and median wall
// time, and median thread CPU time.
struct Stats { double best, median, cpu; };
Stats time_per_op(int64_t iters, int64_t ops_per_iter, int repeats, const std::function<void(int64_t)>& body) {
  body(iters / 10);  // warm up the allocator and caches
  std::vector<double> wall, cpu;
  const double ops = double(iters * ops_per_iter);
  for (int r = 0; r < repeats; ++r) {
    auto t0 = Clock::now();
    double c0 = thread_cpu_seconds();
    body(iters);
    cpu.push_back((thread_cpu_seconds() - c0) * 1e6 / ops);
    wall.push_back(std::chrono::duration<double>(Clock::now() - t0).count() * 1e6 / ops);
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall.front(), wall[wall.size() / 2], cpu[cpu.size() / 2]};
}

void print_row(const char* name, Stats s) {
  std::printf("%-32s %9.3f %9.3f %9.3f %9.1f  %s\n", name, s.best, s.median, s.cpu, kTargetUs,
              s.median <= kTargetUs ? "ok" : "OVER");
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int64_t iters = quick ? 100'000 : 1'000'000;
  const int repeats = quick ? 3 : 5;

  Generator gen(0);
  Tensor a = randn({64}, gen), b = randn({64}, gen);
  autograd::set_requires_grad(a);
  autograd::set_requires_grad(b);
  volatile float sink = 0;  // keeps results observable

  std::printf("bench_op_overhead: time per op on 64 floats (%lld iterations x %d repeats)\n", (long long)iters,
              repeats);
  double load = 0;
  std::ifstream("/proc/loadavg") >> load;
  std::printf("1-min load average %.2f (other processes on the machine inflate the wall times)\n", load);
  std::printf("%-32s %9s %9s %9s %9s\n", "variant", "best us", "median us", "cpu us", "target us");

  print_row("raw ops::add", time_per_op(iters, 1, repeats, [&](int64_t n) {
              for (int64_t i = 0; i < n; ++i) {
                Tensor c = ops::add(a, b);
                if (i == 0) sink = sink + c.data<float>()[0];
              }
            }));

  print_row("a + b, NoGradGuard", time_per_op(iters, 1, repeats, [&](int64_t n) {
              NoGradGuard no_grad;
              for (int64_t i = 0; i < n; ++i) {
                Tensor c = autograd::add(a, b);
                if (i == 0) sink = sink + c.data<float>()[0];
              }
            }));

  print_row("a + b, recorded", time_per_op(iters, 1, repeats, [&](int64_t n) {
              for (int64_t i = 0; i < n; ++i) {
                Tensor c = autograd::add(a, b);
                if (i == 0) sink = sink + c.data<float>()[0];
              }
            }));

  // 16 recorded ops, then backward from the last with an explicit gradient.
  // Gradients accumulate into a.grad and b.grad (add_ in place) as in training.
  constexpr int kChain = 16;
  Tensor seed = ones({64});
  print_row("chain of 16 + backward, per op", time_per_op(iters / kChain, kChain, repeats, [&](int64_t n) {
              for (int64_t i = 0; i < n; ++i) {
                Tensor y = autograd::add(a, b);
                for (int j = 1; j < kChain; ++j) y = autograd::add(y, b);
                autograd::backward({y}, {seed});
              }
            }));
  sink = sink + autograd::grad(a).data<float>()[0];

  std::printf("target: <= %.1f us per recorded op (median of 'a + b, recorded'; the chain row shows what\n"
              "        backward adds on top, for reference)\n", kTargetUs);
  return 0;
}
