#include "parallel/context_parallel/ring_trace.h"

#include "parallel/trace/trace.h"
#include "tensor/error.h"

namespace loom::parallel {

RingStepSpan::RingStepSpan(char pass, int step, int src, int64_t src_chunk0, int64_t src_chunk1) {
  if (!trace::enabled()) return;
  name_ = str("ring ", pass, " s", step, ": K/V of rank ", src, " (chunks ", src_chunk0, " ", src_chunk1, "):");
  start_ = trace::now_us();
}

void RingStepSpan::block(int64_t q_chunk, int64_t k_chunk, bool diagonal) {
  if (start_ >= 0) name_ += str(" q", q_chunk, "k", k_chunk, diagonal ? "*" : "");
}

void RingStepSpan::end() {
  if (start_ >= 0) trace::record(name_, start_, trace::now_us(), trace::kCompute);
  start_ = -1;
}

RingHopSpan::RingHopSpan(char pass, const char* what, int64_t bytes) {
  if (!trace::enabled()) return;
  name_ = str("ring ", pass, " hop ", what, " ", bytes, " B (", bytes / 1024, " KiB)");
  start_ = trace::now_us();
}

void RingHopSpan::close() {
  if (start_ >= 0) trace::record(name_, start_, trace::now_us(), trace::kComm);
  start_ = -1;
}

}  // namespace loom::parallel
