// For the watchdog test that must NOT fire on a rank that is slow outside
// collectives (watchdog.h's LocalWork; issue 52's hang): rank 0 spends 4 s in
// declared local work - standing for a checkpoint's fsync on a busy disk,
// measured at 14 and 24 s while other jobs wrote beside it - while rank 1
// already waits in the next all-reduce under LOOM_COLLECTIVE_TIMEOUT=1. Rank
// 1's watchdog asks, rank 0 answers "busy outside collectives: ...", and rank
// 1 waits on. Exit code 0, the right sum and a wait of several timeouts, or
// the test fails (without LocalWork the watchdog aborts the job after 1 s:
// mpi_watchdog_aborts_a_stuck_collective's case).
#include <chrono>
#include <cstdio>
#include <thread>

#include "parallel/comm/distributed.h"
#include "parallel/comm/watchdog.h"

using namespace loom;

int main(int argc, char** argv) {
  parallel::init(argc, argv);
  parallel::ProcessGroup& world = parallel::world();
  if (world.rank() == 0) {
    parallel::watchdog::LocalWork writing("writing a slow file (watchdog_local_work)");
    std::this_thread::sleep_for(std::chrono::seconds(4));
  }
  Tensor t = full({256}, 1.0);
  const auto start = std::chrono::steady_clock::now();
  world.all_reduce(t);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int bad = t.to_vector<float>()[0] != float(world.size());
  if (world.rank() == 1 && waited < 3) {  // else the test would pass without the watchdog ever deciding
    std::fprintf(stderr, "[rank 1] the all-reduce waited only %.1f s, not past LOOM_COLLECTIVE_TIMEOUT\n", waited);
    bad = 1;
  }
  if (bad) std::fprintf(stderr, "[rank %d] wrong sum or too short a wait\n", world.rank());
  parallel::finalize();
  return bad;
}
