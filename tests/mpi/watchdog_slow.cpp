// For the watchdog test that must NOT fire: a job that is slow but keeps
// making progress. Rank 0 queues 12 all-reduces at once; rank 1 joins them one
// by one, 0.5 s apart. Each collective waits ~0.5 s for rank 1, well under
// LOOM_COLLECTIVE_TIMEOUT=2, while the last one sits in rank 0's queue for ~6 s:
// the watchdog must time each collective from when it starts running, not from
// when it was queued. Exit code 0 and the right sums, or the test fails.
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "parallel/comm/distributed.h"

using namespace loom;

int main(int argc, char** argv) {
  parallel::init(argc, argv);
  parallel::ProcessGroup& world = parallel::world();
  const int n = 12;
  std::vector<Tensor> ts;
  for (int k = 0; k < n; ++k) ts.push_back(full({256}, double(k)));
  if (world.rank() == 0) {
    std::vector<std::shared_ptr<parallel::Work>> works;
    for (Tensor& t : ts) works.push_back(world.all_reduce_async(t));
    for (auto& w : works) w->wait();
  } else {
    for (Tensor& t : ts) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      world.all_reduce(t);
    }
  }
  int bad = 0;
  for (int k = 0; k < n; ++k) bad += ts[size_t(k)].to_vector<float>()[0] != float(k * world.size());
  if (bad) std::fprintf(stderr, "[rank %d] %d all-reduces gave wrong sums\n", world.rank(), bad);
  parallel::finalize();
  return bad ? 1 : 0;
}
