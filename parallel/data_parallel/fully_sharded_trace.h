// ZeRO-3 on the --trace timeline (parallel/trace/trace.h): each layer's
// forward and backward as a compute span ("layer 2 forward"), each unit's
// all-gather and reduce-scatter labelled with its unit ("for": "unit 2"), and
// the waits compute spent on them ("wait for param all-gather, unit 2",
// "wait for gradient reduce-scatter"). docs/12-zero-2-and-3.md reads the
// bytes and the prefetch overlap off it; tests/test_train_gpt_zero3_trace.cpp
// reads it back.
#pragma once

#include <vector>

#include "parallel/data_parallel/fully_sharded_observer.h"
#include "parallel/trace/trace.h"

namespace loom::parallel {

class FullyShardedTrace : public FullyShardedObserver {
 public:
  explicit FullyShardedTrace(size_t num_layers) : spans_(num_layers) {}

  void layer_begins(size_t layer, Pass) override;
  void layer_ends(size_t layer, Pass pass) override;
  std::unique_ptr<Scope> launching(size_t unit) override;
  std::unique_ptr<Scope> waiting(size_t unit, Collective c) override;

 private:
  std::vector<trace::OpenSpan> spans_;  // [layer]: its forward's, then its backward's span
};

}  // namespace loom::parallel
