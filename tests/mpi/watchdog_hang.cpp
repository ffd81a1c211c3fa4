// A deliberately broken program for the watchdog test: rank 0 calls an
// all-reduce that rank 1 never joins. Without the watchdog rank 0 would wait
// forever; with LOOM_COLLECTIVE_TIMEOUT=3 it must print what it is stuck in
// and take the job down with a non-zero exit code.
#include <chrono>
#include <thread>

#include "parallel/comm/distributed.h"

using namespace loom;

int main(int argc, char** argv) {
  parallel::init(argc, argv);
  parallel::ProcessGroup& world = parallel::world();
  if (world.rank() == 0) {
    Tensor t = ones({1024});  // 4096 bytes
    world.all_reduce(t);
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(120));  // "forgets" the all-reduce
  }
  parallel::finalize();
  return 0;
}
