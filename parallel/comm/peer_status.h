// Asking the other ranks where they are, for the collective watchdog
// (watchdog.h): when a collective is stuck, this rank's watchdog thread sends
// every other rank a question on a communicator of its own, and each rank's
// watchdog thread answers with its host and what its queues are doing. An
// answer that is not this collective means a rank skipped it or ran its
// collectives in another order; no answer within a few seconds means the rank
// is dead or cannot be reached - its host is down, or the link to it is cut.
//
//   rank 0 stuck in all_reduce #7 -> asks 1, 2, 3
//   rank 1 (h0): "world (size 4): in all_reduce(sum, float32) #7 for 60 s"  (stuck too: waiting for someone)
//   rank 2 (h1): "world (size 4): idle after #6"                            (never came: skipped it)
//   rank 3 (h1): no answer within 3 s                                       (unreachable or dead)
#pragma once

#include <mpi.h>

#include <memory>

#include "parallel/comm/watchdog.h"

namespace loom::parallel {

// Collective over world (init() calls it): duplicates world for the questions,
// gathers every rank's host name (for the messages) and posts the receive for
// the first question.
std::unique_ptr<watchdog::Peers> mpi_peers(MPI_Comm world);

}  // namespace loom::parallel
