#include "parallel/trace/clock_sync.h"

#include <mpi.h>

#include "parallel/comm/process_group_mpi.h"
#include "tensor/error.h"

namespace loom::parallel::trace {

namespace {
constexpr int kTag = 7300;  // the pings' tag, apart from the pipeline's
}  // namespace

ClockOffset best_offset(const std::vector<PingPong>& samples) {
  LOOM_CHECK(!samples.empty(), "trace::best_offset: no ping-pong samples");
  const PingPong* best = &samples[0];
  for (const PingPong& s : samples)
    if (s.received_us - s.sent_us < best->received_us - best->sent_us) best = &s;
  return {best->peer_us - (best->sent_us + best->received_us) / 2, (best->received_us - best->sent_us) / 2};
}

ClockOffset measure_offset_to_rank0(double (*now_us)(), int rounds) {
  // Raw MPI on MPI_COMM_WORLD (loom's own traffic runs on a duplicate of it):
  // a blocking ping-pong costs the network's round trip, not a round trip
  // through the process group's queue thread as well.
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  double t = 0;
  if (rank == 0) {
    for (int r = 1; r < size; ++r)
      for (int k = 0; k < rounds; ++k) {
        mpiCheck(MPI_Recv(&t, 1, MPI_DOUBLE, r, kTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
        t = now_us();
        mpiCheck(MPI_Send(&t, 1, MPI_DOUBLE, r, kTag, MPI_COMM_WORLD));
      }
    return {};
  }
  std::vector<PingPong> samples(static_cast<size_t>(rounds));
  for (PingPong& s : samples) {
    s.sent_us = now_us();
    mpiCheck(MPI_Send(&t, 1, MPI_DOUBLE, 0, kTag, MPI_COMM_WORLD));
    mpiCheck(MPI_Recv(&t, 1, MPI_DOUBLE, 0, kTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    s.received_us = now_us();
    s.peer_us = t;
  }
  return best_offset(samples);
}

}  // namespace loom::parallel::trace
