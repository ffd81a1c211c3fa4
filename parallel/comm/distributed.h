// Starting and stopping the distributed runtime. A program that may run under
// `mpirun -np N` calls init() first and finalize() last, or hands its body to
// run(), which also turns an exception on any rank into a clean job-wide abort.
// Started without mpirun, the same program is a world of one rank (MPI's
// singleton init): no special case anywhere.
//
//   int main(int argc, char** argv) {
//     return loom::parallel::run(argc, argv, [&] {
//       ProcessGroup& world = loom::parallel::world();
//       ...
//       return 0;
//     });
//   }
#pragma once

#include <functional>
#include <string>

#include "parallel/comm/process_group.h"

namespace loom::parallel {

// MPI_Init_thread(MPI_THREAD_MULTIPLE) (an error if the library provides less),
// the world group, the collective watchdog (LOOM_COLLECTIVE_TIMEOUT), and a
// std::terminate handler that prints the failing rank and aborts the job.
// Idempotent.
void init(int& argc, char**& argv);
void init();
// Stops every group's thread, then MPI_Finalize. Groups still alive become unusable.
void finalize();
bool is_initialized();

// All ranks of the job (a duplicate of MPI_COMM_WORLD). Error before init().
ProcessGroup& world();

// init(); main_fn(); finalize(). If main_fn throws on some rank, that rank
// prints "[loom rank R] error: <message>" and aborts the whole job with exit
// code 1, so the other ranks do not wait forever in their next collective.
// Returns main_fn's result.
int run(int argc, char** argv, const std::function<int()>& main_fn);

// Prints message to stderr and terminates every rank of the job (MPI_Abort).
// Returns never: if MPI_Abort has not ended this process within 5 s (mpirun
// cannot be reached), the process exits by itself with exit_code.
[[noreturn]] void abort_job(const std::string& message, int exit_code = 1);

}  // namespace loom::parallel
