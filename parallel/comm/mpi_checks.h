// Internal to parallel/comm/: the checks and the dtype mapping every MPI call
// of the MPI backend shares (process_group_mpi.cpp, mpi_p2p.cpp).
#pragma once

#include <mpi.h>

#include <string>

#include "tensor/tensor.h"

namespace loom::parallel {

// How a dtype travels: half types as raw 16-bit words (reductions convert them to fp32 first).
MPI_Datatype mpi_type(DType t);
// Defined, on the CPU or a GPU, contiguous, and within MPI's int counts.
void check_tensor(const char* op, const Tensor& t, const char* what);

// MPI reads and writes host memory (loom does not assume a CUDA-aware MPI),
// so a CUDA tensor travels through a host copy, made when its operation runs:
// on the group's thread for queued operations, which is after the producer's
// kernels were enqueued on loom's stream (a bucket's main_grad += grad), and
// the copy down waits for them. put_back() copies the result up, enqueued on
// the same stream before the Work completes, so whatever the caller enqueues
// after wait() reads it; it goes through a pinned buffer (tensor/cuda/pinned.h),
// so the group's thread does not wait for the GPU to catch up. The copy down
// lands in pageable memory: MPI needs the values on the host before it can
// start, so that copy waits anyway. For a CPU tensor host() is the tensor
// itself and nothing is copied.
class HostStaging {
 public:
  // fetch: bring t's values down (inputs, in-place buffers); else host() is
  // an uninitialised host buffer of t's shape (outputs).
  HostStaging(const Tensor& t, bool fetch);
  const Tensor& host() const { return host_; }
  void put_back() const;

 private:
  Tensor device_, host_;
};
// A peer in the group other than this rank, and a tag MPI guarantees (0..32767).
void check_peer(const char* op, int peer, int rank, int size, int tag, const std::string& name);

}  // namespace loom::parallel
