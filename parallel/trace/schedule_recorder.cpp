#include "parallel/trace/schedule_recorder.h"

namespace loom::parallel {

std::string ScheduleRecorder::name(char kind, int mb, int chunk) const {
  if (!pipelined_) return kind == 'F' ? "forward" : "backward";
  return num_chunks_ > 1 ? str(kind, mb, ".", chunk) : str(kind, mb);
}

ScheduleRecorder::Op::Op(ScheduleRecorder& r, char kind, int mb, int chunk)
    : r_(r), event_{kind, mb, schedule_clock_us(), 0, chunk}, span_(r.name(kind, mb, chunk)) {}

ScheduleRecorder::Op::~Op() {
  event_.end_us = schedule_clock_us();
  std::lock_guard<std::mutex> lock(r_.mutex_);
  r_.events_.push_back(event_);
}

}  // namespace loom::parallel
