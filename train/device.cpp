#include "train/device.h"

#include <cstdlib>

#include "parallel/comm/distributed.h"
#include "parallel/comm/process_group_by_device.h"
#include "parallel/comm/process_group_nccl.h"
#include "tensor/cuda/cuda.h"
#include "tensor/cuda/kernel_choice.h"
#include "tensor/numbers.h"
#include "tensor/ops.h"

namespace loom::train {

namespace {

// This process's rank among the processes on its machine, as the launcher
// says (Open MPI, MPICH, Slurm); 0 when launched alone.
int local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* v = std::getenv(name)) return parse_number<int>(v, name, {0, 1 << 20});  // atoi("x") was 0
  return 0;
}

}  // namespace

Device rank_device(const Args& a) {
  const Device device(a.device);
  if (device.is_cpu() || a.device != "cuda") return device;  // cpu, or cuda:N as asked
  // Megatron's and llm.c's rule: local rank modulo the GPUs this process sees.
  // Ranks outnumbering GPUs share them (over --backend mpi; NCCL refuses that).
  const int n = cuda::device_count();
  LOOM_CHECK(n > 0, "--device cuda: no CUDA device (", cuda::unavailable_reason(), ")");
  return Device(str("cuda:", local_rank() % n));
}

std::unique_ptr<parallel::ProcessGroup> gpu_world(const Args& a) {
  parallel::ProcessGroup& mpi = parallel::world();
  const Device device = rank_device(a);
  if (!device.is_cuda() || a.backend == "mpi" || mpi.size() == 1) return nullptr;
  return std::make_unique<parallel::ProcessGroupByDevice>(mpi, parallel::make_nccl_world(mpi, device), "world");
}

void move_to_device(parallel::Model& m, const Args& a) {
  const Device device = rank_device(a);
  if (device.is_cpu()) return;
  cuda::set_allow_tf32(a.tf32);
  if (!a.cuda_kernels.empty()) cuda::set_kernel_choice(cuda::parse_kernel_choice(a.cuda_kernels, "--cuda-kernels"));
  m.to(device);  // in place: the tied wte stays one tensor; the pipeline receives there too
}

void to_device(std::vector<parallel::MicroBatch>& mbs, const Args& a) {
  const Device device = rank_device(a);
  if (device.is_cpu()) return;
  for (parallel::MicroBatch& b : mbs) b = {ops::to(b.x, device), ops::to(b.y, device)};
}

}  // namespace loom::train
