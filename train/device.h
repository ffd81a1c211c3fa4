// train_gpt's --device cuda[:N]: the model and each step's batches moved to
// the GPU. The model is built on the CPU by the seeded generators, then moved,
// so a CPU run and a GPU run start from identical weights (and the GPU run's
// losses can be checked against the CPU's, tests/cuda/test_cuda_train_gpt.cpp).
// On the CPU both helpers do nothing.
#pragma once

#include <memory>
#include <vector>

#include "parallel/comm/process_group.h"
#include "parallel/microbatch_runner.h"
#include "parallel/model.h"
#include "train/args.h"

namespace loom::train {

// This rank's device: --device as given, except a bare `cuda`, which is
// cuda:(local rank mod the number of GPUs) - one GPU per rank on a node.
Device rank_device(const Args& a);
// The world train_gpt's groups are split from, when GPU tensors travel over
// NCCL (--device cuda on several ranks, --backend nccl, the default): CUDA
// tensors over NCCL, host ones (found_inf, the grad norm, the loss) over MPI
// (parallel/comm/process_group_by_device.h). nullptr: use MPI's world alone.
std::unique_ptr<parallel::ProcessGroup> gpu_world(const Args& a);
// --device cuda[:N]: the params, built on the CPU by the seeded generators
// (the weights of a CPU run), moved to the GPU in place; TF32 as --tf32 says.
// Called by build_model. The CPU: nothing to do.
void move_to_device(parallel::Model& m, const Args& a);
// A step's micro-batches, copied to --device.
void to_device(std::vector<parallel::MicroBatch>& mbs, const Args& a);

}  // namespace loom::train
