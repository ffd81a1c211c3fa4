// bench_allreduce: the bandwidth of ProcessGroup::all_reduce (MPI backend, run
// on the group's communication thread) beside raw MPI_Allreduce on
// MPI_COMM_WORLD, in the same run, for 4 KiB to 64 MiB of fp32. The gap is
// what loom's queue costs: a hand-off to the comm thread and a condition
// variable on completion - tens of microseconds, visible only on small messages.
//
// --device cuda: loom's all-reduce of a GPU tensor, over --backend mpi (staged
// through host memory: two PCIe copies per call) or nccl, each call timed to
// the GPU's completion, beside the same raw MPI_Allreduce of host memory. On
// the GPU machine's one GPU only NCCL at world size 1 can run (NCCL refuses
// two ranks on one GPU); mpi runs at any size.
//
// Bandwidths as nccl-tests reports them: algbw = bytes / time, busbw = algbw *
// 2(n-1)/n (the bytes each rank must move in a ring all-reduce, so busbw is
// comparable across rank counts). Time = the slowest rank's, best of 3 rounds.
//
// Usage: mpirun -np 2 build/bench/bench_allreduce [--quick] [--device cuda[:N] [--backend mpi|nccl]]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "parallel/comm/distributed.h"
#include "parallel/comm/process_group_nccl.h"
#include "tensor/cuda/cuda.h"
#include "tensor/tensor.h"

using namespace loom;

namespace {

// Seconds per call of fn, the max over ranks (every rank must agree on iters).
double time_per_call(int iters, const std::function<void()>& fn) {
  MPI_Barrier(MPI_COMM_WORLD);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) fn();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  return parallel::run(argc, argv, [&] {
    bool quick = false;
    Device device = kCPU;
    std::string backend = "mpi";
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--quick") quick = true;
      else if (arg == "--device" && i + 1 < argc) device = Device(argv[++i]);
      else if (arg == "--backend" && i + 1 < argc) backend = argv[++i];
      else throw Error(str("bench_allreduce: unknown argument '", arg, "' (--quick, --device D, --backend mpi|nccl)"));
    }
    LOOM_CHECK(backend == "mpi" || backend == "nccl", "bench_allreduce: --backend ", backend, " is not mpi or nccl");
    LOOM_CHECK(backend == "mpi" || device.is_cuda(), "bench_allreduce: --backend nccl needs --device cuda");
    std::unique_ptr<parallel::ProcessGroup> nccl;
    if (backend == "nccl") nccl = parallel::make_nccl_world(parallel::world(), device);
    parallel::ProcessGroup& world = nccl ? *nccl : parallel::world();
    const int n = world.size();
    if (world.rank() == 0) {
      std::printf("all_reduce(sum) of fp32 on %d ranks: ProcessGroup (%s, %s) vs raw MPI_Allreduce of host memory\n",
                  n, device.str().c_str(), backend.c_str());
      std::printf("%10s %12s %12s %12s %12s %8s\n", "bytes", "raw us", "loom us", "raw busbw", "loom busbw",
                  "loom/raw");
    }
    for (int64_t bytes = 4 << 10; bytes <= (64 << 20); bytes *= 4) {
      const int64_t count = bytes / 4;
      Tensor host = ones({count}), t = device.is_cpu() ? host : ones({count}, kFloat32, device);
      // ~0.2 s per measurement (less with --quick), at least 5 calls.
      int iters = int(std::clamp<int64_t>((int64_t(quick ? 16 : 128) << 20) / bytes, 5, 2000));
      auto raw = [&] { MPI_Allreduce(MPI_IN_PLACE, host.raw_data(), int(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); };
      auto mine = [&] {
        world.all_reduce(t);
        if (device.is_cuda()) cuda::synchronize(device);  // NCCL's wait() only orders loom's stream: time to completion
      };
      raw();  // warm up both paths (connections, buffers)
      mine();
      double best_raw = 1e30, best_loom = 1e30;
      for (int round = 0; round < 3; ++round) {  // interleaved, so drift hits both
        best_raw = std::min(best_raw, time_per_call(iters, raw));
        best_loom = std::min(best_loom, time_per_call(iters, mine));
      }
      if (world.rank() == 0) {
        double factor = 2.0 * (n - 1) / n;
        auto busbw = [&](double s) { return n == 1 ? 0.0 : double(bytes) / s * factor / 1e9; };
        std::printf("%10lld %12.1f %12.1f %9.2f GB/s %7.2f GB/s %8.2f\n", (long long)bytes, best_raw * 1e6,
                    best_loom * 1e6, busbw(best_raw), busbw(best_loom), best_loom / best_raw);
      }
    }
    return 0;
  });
}
