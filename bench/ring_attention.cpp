// bench_ring_attention: the attention of context parallelism
// (parallel/context_parallel/ring_attention.h) at cp = 1, 2, 4 on long
// sequences, forward + backward, printed beside its formulas.
//
// The world is cut into groups of cp consecutive ranks; each group runs one
// ring over its zig-zag chunks of the same sequences [B, H, T, hd]. Per rank:
//   bytes sent    counted by a wrapper around the cp group, beside the formula.
//                 One K/V block is K = 2 B (T/cp) C elements (C = H hd);
//                 forward sends it cp - 1 times, backward cp - 1 times more and
//                 dK/dV (fp32) cp times:   (3 cp - 2) K x 4 bytes (fp32 inputs),
//                 about 3 x the whole sequence's K and V, whatever cp.
//   ms            forward + backward, median of --reps (the slowest rank).
//   waited ms     time inside the hops' wait(): the communication the ring
//                 did not hide behind a block's math; exposed = waited / ms.
//                 Backward posts each step's dK/dV hop and waits for it only
//                 after the next step's math (ring_attention.cpp), as forward
//                 does with K/V; bench/README.md has the numbers before and after.
//                 The ranks share this machine's cores, so no speed-up is
//                 expected on a laptop; the overlap condition is the lesson:
//                 a hop hides behind a step's math when
//                   2 c C s / bandwidth  <=  4 c^2 C / flops   (c = T / 2cp, s bytes an element)
//                 i.e. c >= s flops / (2 bandwidth): ~8k tokens a chunk for an
//                 H100 (4e14 bf16 flop/s) over 400 Gb/s InfiniBand.
//
// Usage: mpirun -np 4 build/bench/bench_ring_attention [--block 2048] [--batch 1] [--heads 4] [--hd 32] [--reps 3]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "bench/timing.h"
#include "parallel/comm/distributed.h"
#include "parallel/comm/process_group_decorator.h"
#include "parallel/context_parallel/ring_attention.h"
#include "parallel/context_parallel/zigzag.h"
#include "tensor/ops.h"

using namespace loom;
using namespace loom::parallel;

namespace {

int64_t flag(int argc, char** argv, const char* name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoll(argv[i + 1]);
  return fallback;
}

// A wait() that adds the time it blocked to a counter.
struct TimedWork : Work {
  std::shared_ptr<Work> inner;
  double* waited_ms;
  TimedWork(std::shared_ptr<Work> w, double* ms) : inner(std::move(w)), waited_ms(ms) {}
  void wait() override {
    const auto t0 = bench::Clock::now();
    inner->wait();
    *waited_ms += bench::ms_since(t0);
  }
  bool is_completed() override { return inner->is_completed(); }
};

// The cp group, counting the bytes sent and the time waited for the hops.
struct WatchedGroup : ProcessGroupDecorator {
  using ProcessGroupDecorator::ProcessGroupDecorator;
  int64_t bytes_sent = 0;
  double waited_ms = 0;
  std::shared_ptr<Work> isend(const Tensor& t, int dst, int tag) override {
    bytes_sent += t.numel() * int64_t(element_size(t.dtype()));
    return std::make_shared<TimedWork>(inner_.isend(t, dst, tag), &waited_ms);
  }
  std::shared_ptr<Work> irecv(const Tensor& t, int src, int tag) override {
    return std::make_shared<TimedWork>(inner_.irecv(t, src, tag), &waited_ms);
  }
};

}  // namespace

int main(int argc, char** argv) {
  return run(argc, argv, [&] {
    ProcessGroup& world = parallel::world();
    const int64_t T = flag(argc, argv, "--block", 2048), B = flag(argc, argv, "--batch", 1),
                  H = flag(argc, argv, "--heads", 4), hd = flag(argc, argv, "--hd", 32),
                  reps = flag(argc, argv, "--reps", 3);
    const bool rank0 = world.rank() == 0;
    if (rank0)
      std::printf("ring attention: B %lld, H %lld, T %lld, hd %lld (C %lld), fp32, forward + backward; %d ranks\n",
                  (long long)B, (long long)H, (long long)T, (long long)hd, (long long)(H * hd), world.size());
    if (rank0)
      std::printf("%4s %10s %16s %16s %10s %11s %8s\n", "cp", "T/cp", "bytes sent/rank", "formula", "ms", "waited ms",
                  "exposed");
    Generator gen(3);
    const Tensor q = randn({B, H, T, hd}, gen), k = randn({B, H, T, hd}, gen), v = randn({B, H, T, hd}, gen);
    for (int cp : {1, 2, 4}) {
      if (world.size() % cp != 0 || T % (2 * cp) != 0) continue;
      std::unique_ptr<ProcessGroup> group = world.split(world.rank() / cp, world.rank(), "cp");
      WatchedGroup watched(*group);
      auto mine = [&](const Tensor& t) {
        Tensor c = ops::clone(zigzag_take(t, 2, cp, group->rank()));
        autograd::set_requires_grad(c, true);
        return c;
      };
      std::vector<double> ms;
      for (int64_t rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
        Tensor ql = mine(q), kl = mine(k), vl = mine(v);
        watched.bytes_sent = 0, watched.waited_ms = 0;
        world.barrier();
        const auto t0 = bench::Clock::now();
        autograd::backward(autograd::sum(ring_attention(ql, kl, vl, watched)));
        if (rep > 0) ms.push_back(bench::max_over_ranks(bench::ms_since(t0)));
        else bench::max_over_ranks(0);
      }
      const double waited = bench::max_over_ranks(watched.waited_ms);
      const int64_t K = 2 * B * (T / cp) * H * hd;  // one K/V block, elements
      const int64_t formula = cp == 1 ? 0 : (3 * cp - 2) * K * 4;
      if (rank0)
        std::printf("%4d %10lld %16lld %16lld %10.1f %11.1f %7.0f%%\n", cp, (long long)(T / cp),
                    (long long)watched.bytes_sent, (long long)formula, bench::median(ms), waited,
                    100 * waited / bench::median(ms));
    }
    return 0;
  });
}
