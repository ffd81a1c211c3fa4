// The small timing helpers the multi-rank benches share: milliseconds since a
// time point, the slowest rank's value (a step is done when the last rank is),
// and the median of repeated measurements (robust to one slow outlier).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace loom::bench {

using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

inline double max_over_ranks(double v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return v;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace loom::bench
