// What a rank is about to run, checked across the group before every MPI
// collective (process_group_mpi.cpp's arrive()). Collectives trust that every
// rank passes the same sizes: two dp ranks whose models differ (another
// vocabulary) would have MPI read past one rank's buffer. So each collective
// first all-reduces (MPI_MAXLOC) four (value, rank) pairs:
//   ( sig, rank), (-sig, rank)   the max and min over ranks of the signature
//   ( n,   rank), (-n,   rank)   (which collective, reduce op, dtype) and count
// Every rank then sees the same max and min with a rank holding each, so all
// of them throw the same kind of error, naming both ranks, or none does.
#pragma once

#include <cstdint>
#include <string>

#include "parallel/comm/process_group.h"

namespace loom::parallel {

enum class Collective { AllReduce, ReduceScatter, AllGather, Broadcast, Barrier, AllToAll };

struct CallAgreement {
  int pairs[8];  // MPI_2INT pairs, the send buffer of the MAXLOC all-reduce

  // count: elements of the input that must match across ranks (fits an int:
  // the MPI backend refuses more than 2^31 - 1).
  CallAgreement(Collective kind, ReduceOp op, DType dtype, int64_t count, int rank);
  // reduced: the all-reduced pairs. Throws loom::Error, naming this rank's call
  // and another rank's, when the group disagrees.
  void check(const int reduced[8], const std::string& group, int group_size) const;
};

}  // namespace loom::parallel
