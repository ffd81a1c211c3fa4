// The NCCL backend of ProcessGroup: CUDA tensors, one NCCL communicator and one
// CUDA stream per group, so a group's operations run in FIFO order beside
// loom's compute stream (the GPU form of the MPI backend's thread).
//
// Bootstrap: NCCL needs every rank to hold the same ncclUniqueId before
// ncclCommInitRank. Rank 0 of an existing group (the MPI world) makes it and
// broadcasts its 128 bytes over that group, as llm.c and nccl-tests do:
//   std::unique_ptr<ProcessGroup> gpu_world = make_nccl_world(parallel::world(), Device("cuda:0"));
//
// Stream order (why there are events, and no host waits):
//   caller's stream (loom's)   ... main_grad += grad | record "ready"           | (wait "done") next op reads the result
//   group's stream (NCCL's)                           wait "ready" | ncclAllReduce | record "done"
// Work::wait() makes loom's stream wait for "done" and returns at once; the
// host blocks only where a value must reach it (.item(), a copy to the CPU).
// Until a Work is waited its tensors belong to the group: it holds them, and
// must be waited (or destroyed, which then waits on the host) before their
// memory can go back to loom's caching allocator for reuse. Each group has its
// own stream, so two groups' operations can run at once: every rank must issue
// them in the same order across groups too, or their kernels may wait on each
// other forever (NCCL's "using multiple communicators concurrently").
//
// The collective watchdog (LOOM_COLLECTIVE_TIMEOUT) watches each group's
// stream through two events per operation (nccl_in_flight.h): one stuck past
// the timeout is named (group, op, sequence number, bytes), its communicator
// aborted (ncclCommAbort), and the job ended. NCCL refuses two ranks on one
// GPU; ranks sharing a GPU use the MPI backend (which stages CUDA tensors
// through the host).
#pragma once

#include <memory>

#include "parallel/comm/process_group.h"

namespace loom::parallel {

// True when this build has the NCCL backend (LOOM_CUDA=ON and CMake found NCCL).
bool built_with_nccl();

// Collective over bootstrap (every rank calls it): a group of the same ranks,
// named "world", whose operations run through NCCL on device (this rank's
// GPU, e.g. cuda:<local rank>). Throws loom::Error on every rank when some
// rank has no usable GPU, and in a build without NCCL.
std::unique_ptr<ProcessGroup> make_nccl_world(ProcessGroup& bootstrap, const Device& device);

}  // namespace loom::parallel
