// Internal to parallel/comm/: the checks and the dtype mapping every MPI call
// of the MPI backend shares (process_group_mpi.cpp, mpi_p2p.cpp).
#pragma once

#include <mpi.h>

#include <string>

#include "tensor/tensor.h"

namespace loom::parallel {

// How a dtype travels: half types as raw 16-bit words (reductions convert them to fp32 first).
MPI_Datatype mpi_type(DType t);
// Defined, on the CPU, contiguous, and within MPI's int counts.
void check_tensor(const char* op, const Tensor& t, const char* what);
// A peer in the group other than this rank, and a tag MPI guarantees (0..32767).
void check_peer(const char* op, int peer, int rank, int size, int tag, const std::string& name);

}  // namespace loom::parallel
