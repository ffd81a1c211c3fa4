// The ring's steps on the --trace timeline (parallel/trace/trace.h), so that
// docs/trace_summary.py --ring can draw, for each cp rank and ring step, the
// K/V block it holds, the blocks it computes and the hop in flight beside them.
//   compute track        "ring F s1: K/V of rank 1 (chunks 1 2): q3k1 q3k2"   (* a diagonal, causal block)
//   communication track  "ring F hop K/V 32768 B (32 KiB)", from its post to the end of its wait
// F is the forward ring, B the backward one (its hops "K/V" and "dK/dV").
// Nothing is recorded unless tracing is on.
#pragma once

#include <string>
#include <vector>

#include "parallel/context_parallel/zigzag.h"

namespace loom::parallel {

// One ring step's compute span, from construction to destruction: around the
// step's math (the waits for its hops come after), naming the blocks it computes.
class RingStepSpan {
 public:
  RingStepSpan(char pass, int step, int src, int cp, const std::vector<ZigzagBlock>& blocks);
  ~RingStepSpan();
  RingStepSpan(const RingStepSpan&) = delete;
  RingStepSpan& operator=(const RingStepSpan&) = delete;

 private:
  std::string name_;
  double start_ = -1;
};

// One hop's span: opened when its send and receive are posted, closed when both are done.
class RingHopSpan {
 public:
  RingHopSpan() = default;
  RingHopSpan(char pass, const char* what, int64_t bytes);
  void close();

 private:
  std::string name_;
  double start_ = -1;
};

}  // namespace loom::parallel
