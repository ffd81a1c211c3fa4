// Putting every rank's timeline on rank 0's clock. Hosts do not share a
// clock: each one's steady clock started at its own boot, so a trace from
// several machines needs each rank's offset against rank 0. trace::start()
// takes its zero right after a barrier (off by the barrier's exit skew, up to
// a one-way latency), then measures what is left the way NTP does: a few
// ping-pongs with rank 0, each giving
//
//        this rank            rank 0
//   sent ------- ping ------->  |
//                               peer  (rank 0's clock when it answers)
//   received <-- pong ---------  |
//
//   offset = peer - (sent + received) / 2     error <= (received - sent) / 2
//
// (exact if both legs take equally long; never wrong by more than half the
// round trip). The sample with the shortest round trip is kept.
#pragma once

#include <vector>


namespace loom::parallel::trace {

struct PingPong {
  double sent_us = 0, peer_us = 0, received_us = 0;  // this rank's clock, rank 0's, this rank's
};

struct ClockOffset {
  double offset_us = 0;  // add to this rank's time to get rank 0's
  double error_us = 0;   // at most this far off: half the best round trip
};

// The estimate from the sample with the shortest round trip. Error if empty.
ClockOffset best_offset(const std::vector<PingPong>& samples);

// Collective over MPI_COMM_WORLD: rank 0 answers `rounds` pings from each
// other rank in turn, clocks read by now_us; every rank returns its offset
// (rank 0: 0 +- 0). n - 1 ranks x rounds round trips, one after another.
ClockOffset measure_offset_to_rank0(double (*now_us)(), int rounds = 16);

}  // namespace loom::parallel::trace
