// The turn of the V (ChunkLayout::V, partition.h), on the last rank: chunk 0's
// output is chunk 1's input, and chunk 1's input gradient is chunk 0's output
// gradient, handed over in memory - no transfer. PipelineP2P's ring verbs put
// and take here where a V's chunk would cross from one way to the other.
#pragma once

#include <deque>
#include <string>
#include <utility>

#include "tensor/tensor.h"

namespace loom::parallel {

class VTurn {
 public:
  void put(int mb, Tensor t) { held_.emplace_back(mb, std::move(t)); }
  // The oldest tensor put; an error unless it is micro-batch mb's (a schedule out of order).
  Tensor take(const char* verb, int stage, int mb) {
    LOOM_CHECK(!held_.empty() && held_.front().first == mb, verb, ": stage ", stage, " turns the V with micro-batch ",
               mb, " but holds ", held_.empty() ? std::string("nothing") : str("micro-batch ", held_.front().first),
               " (a schedule out of order)");
    Tensor t = std::move(held_.front().second);
    held_.pop_front();
    return t;
  }
  void clear() { held_.clear(); }

 private:
  std::deque<std::pair<int, Tensor>> held_;  // (micro-batch, tensor), in the order put
};

}  // namespace loom::parallel
