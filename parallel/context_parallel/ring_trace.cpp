#include "parallel/context_parallel/ring_trace.h"

#include "parallel/trace/trace.h"
#include "tensor/error.h"

namespace loom::parallel {

RingStepSpan::RingStepSpan(char pass, int step, int src, int cp, const std::vector<ZigzagBlock>& blocks) {
  if (!trace::enabled()) return;
  const std::array<int64_t, 2> chunks = zigzag_chunks(src, cp);
  name_ = str("ring ", pass, " s", step, ": K/V of rank ", src, " (chunks ", chunks[0], " ", chunks[1], "):");
  for (const ZigzagBlock& b : blocks) name_ += str(" q", b.q_chunk, "k", b.k_chunk, b.diagonal ? "*" : "");
  start_ = trace::now_us();
}

RingStepSpan::~RingStepSpan() {
  if (start_ >= 0) trace::record(name_, start_, trace::now_us(), trace::kCompute);
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
