// The job test_cuda_nccl_watchdog.cpp runs under mpiexec, to see the
// collective watchdog (parallel/comm/watchdog.h) watch NCCL work:
//
//   hang  (2 ranks, 2 GPUs): rank 0 all-reduces over NCCL, rank 1 never joins.
//         Without the watchdog rank 0's kernel would spin and its host wait in
//         synchronize() forever; with LOOM_COLLECTIVE_TIMEOUT=3 the job must
//         end, naming the group, op, sequence number and bytes.
//   slow  (1 rank, 1 GPU): an all-reduce queued on loom's stream behind about
//         three timeouts' worth of matmuls. It is not running until they end,
//         so the watchdog must not fire (it times an NCCL operation from the
//         moment its "started" event completes: nccl_in_flight.h). Prints
//         "slow: done after X s" and exits 0.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "parallel/comm/distributed.h"
#include "parallel/comm/process_group_nccl.h"
#include "parallel/comm/watchdog.h"
#include "tensor/cuda/cuda.h"
#include "tensor/ops.h"

using namespace loom;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// GPU seconds per 4096^3 fp32 matmul on this device (10 timed after 2 warm-up).
double matmul_seconds(const Tensor& a, const Device& dev) {
  Tensor busy = ops::matmul(a, a);
  busy = ops::matmul(busy, a);
  cuda::synchronize(dev);
  const auto t0 = Clock::now();
  for (int i = 0; i < 10; ++i) busy = ops::matmul(busy, a);
  cuda::synchronize(dev);
  return seconds_since(t0) / 10;
}

}  // namespace

int main(int argc, char** argv) {
  parallel::init(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  const int rank = parallel::world().rank();
  const Device dev("cuda:" + std::to_string(rank % cuda::device_count()));
  std::unique_ptr<parallel::ProcessGroup> nccl = parallel::make_nccl_world(parallel::world(), dev);
  if (mode == "hang") {
    if (rank == 0) {
      Tensor t = ones({1024}, kFloat32, dev);  // 4096 bytes
      nccl->all_reduce(t);
      cuda::synchronize(dev);  // waits for a kernel whose peer never comes
    } else {
      std::this_thread::sleep_for(std::chrono::seconds(120));  // "forgets" the all-reduce
    }
  } else if (mode == "slow") {
    const double timeout = parallel::watchdog::timeout_from_env();
    Tensor a = ops::mul(ones({4096, 4096}, kFloat32, dev), 1e-4);
    const int n = int(3 * timeout / matmul_seconds(a, dev)) + 1;
    const auto t0 = Clock::now();
    Tensor busy = a;
    for (int i = 0; i < n; ++i) busy = ops::matmul(busy, a);  // queued on loom's stream
    Tensor t = ones({1024}, kFloat32, dev);
    nccl->all_reduce(t);                                      // queued behind them
    cuda::synchronize(dev);
    std::printf("slow: done after %.1f s (%d matmuls, timeout %.1f s), sum %.0f\n", seconds_since(t0), n, timeout,
                ops::sum(t).item<double>());
  } else {
    std::fprintf(stderr, "usage: nccl_watchdog_job hang|slow\n");
    return 2;
  }
  nccl.reset();
  parallel::finalize();
  return 0;
}
