// What watches a schedule run, so that the runner (microbatch_runner.h) holds
// one line of it per forward and backward: each op becomes a trace span on
// the compute track (trace.h) and a ScheduleEvent for --print-schedule
// (schedule_diagram.h). Names: in a pipeline "F3" / "B3" (micro-batch 3), with
// chunks "F3.1" (on chunk 1); on one stage "forward" / "backward".
#pragma once

#include <mutex>
#include <optional>
#include <string>

#include "parallel/trace/schedule_diagram.h"
#include "parallel/trace/trace.h"

namespace loom::parallel {

class ScheduleRecorder {
 public:
  // pipelined: name ops by micro-batch (F3); num_chunks > 1 adds the chunk (F3.1).
  ScheduleRecorder(bool pipelined, int num_chunks) : pipelined_(pipelined), num_chunks_(num_chunks) {}

  // RAII: one forward ('F') or backward ('B') from construction to destruction.
  class Op {
   public:
    Op(ScheduleRecorder& r, char kind, int mb, int chunk);
    ~Op();
    Op(const Op&) = delete;
    Op& operator=(const Op&) = delete;

   private:
    ScheduleRecorder& r_;
    ScheduleEvent event_;
    trace::Span span_;
  };

  StageEvents take_events() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::move(events_);
  }

 private:
  std::string name(char kind, int mb, int chunk) const;
  bool pipelined_;
  int num_chunks_;
  std::mutex mutex_;  // DualPipeV's overlapped pairs end ops on two threads (overlapped_pairs.h)
  StageEvents events_;
};

}  // namespace loom::parallel
