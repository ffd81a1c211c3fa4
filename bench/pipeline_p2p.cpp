// bench_pipeline_p2p: what one pipeline transfer costs, without compute.
// Two stages play the steady state of 1F1B with nothing to compute: stage 0
// sends an activation [b, T, C] downstream and receives its gradient back,
// stage 1 receives the activation and sends the gradient (the same shape)
// back, N times. The time per round trip / 2 is the cost of one transfer:
// posting the send, the receiving comm thread's wake-up, the header and the
// payload messages. Two times:
//   single transfers   each verb on its own: a header with every tensor, and
//                      each send waited for;
//   in a schedule      between begin_schedule() and end_schedule(), as every
//                      schedule runs them: the header with the first tensor of
//                      each channel only, sends not waited for until the end.
// Beside each time, the context switches per transfer (getrusage, both kinds,
// every thread of rank 0): each hand-over to or from a communication thread
// is one, and on a busy machine each costs a scheduler's wake-up.
//
// Usage: mpirun -np 2 build/bench/bench_pipeline_p2p [--n 2000] [--batch 4] [--block 64] [--embd 128]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <sys/resource.h>

#include "parallel/comm/distributed.h"
#include "parallel/pipeline_parallel/pipeline_p2p.h"

using namespace loom;
using namespace loom::parallel;

int main(int argc, char** argv) {
  return parallel::run(argc, argv, [&] {
    int64_t n = 2000, batch = 4, block = 64, embd = 128;
    for (int i = 1; i + 1 < argc; i += 2) {
      std::string k = argv[i];
      int64_t v = std::atoll(argv[i + 1]);
      if (k == "--n") n = v;
      else if (k == "--batch") batch = v;
      else if (k == "--block") block = v;
      else if (k == "--embd") embd = v;
      else LOOM_CHECK(false, "bench_pipeline_p2p: unknown option ", k);
    }
    ProcessGroup& world = parallel::world();
    LOOM_CHECK(world.size() == 2, "bench_pipeline_p2p: run it on 2 ranks");
    PipelineP2P p2p(world);
    Tensor act = full({batch, block, embd}, 1.0), grad = full({batch, block, embd}, 2.0);
    auto round_trips = [&](int64_t count) {
      for (int64_t i = 0; i < count; ++i) {
        if (p2p.is_first_stage()) {
          p2p.send_forward(act, int(i));
          p2p.recv_backward(int(i));
        } else {
          p2p.recv_forward(int(i));
          p2p.send_backward(grad, int(i));
        }
      }
    };
    auto context_switches = [] {
      rusage u{};
      getrusage(RUSAGE_SELF, &u);
      return double(u.ru_nvcsw + u.ru_nivcsw);
    };
    // {us, context switches} per transfer, over n round trips.
    struct Cost {
      double us = 1e30, switches = 0;
    };
    auto time = [&](Cost& best, bool in_schedule) {
      world.barrier();
      const double s0 = context_switches();
      const auto t0 = std::chrono::steady_clock::now();
      if (in_schedule) p2p.begin_schedule();
      round_trips(n);
      if (in_schedule) p2p.end_schedule();
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / double(2 * n);
      if (us < best.us) best = {us, (context_switches() - s0) / double(2 * n)};
    };
    round_trips(50);  // warm-up
    // Each mode twice, interleaved, keeping the faster: the machine's noise is large.
    Cost single, scheduled;
    for (int round = 0; round < 2; ++round) {
      time(single, false);
      time(scheduled, true);
    }
    if (world.rank() == 0)
      std::printf("p2p [%lld, %lld, %lld] float32 (%.1f KB), %lld round trips, us (context switches) per transfer: "
                  "single transfers %.1f (%.1f), in a schedule %.1f (%.1f) %.2fx\n",
                  (long long)batch, (long long)block, (long long)embd, double(act.nbytes()) / 1024, (long long)n,
                  single.us, single.switches, scheduled.us, scheduled.switches, single.us / scheduled.us);
    return 0;
  });
}
