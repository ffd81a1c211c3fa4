#include "parallel/data_parallel/fully_sharded_trace.h"

#include "tensor/error.h"

namespace loom::parallel {

namespace {

struct LabelScope : FullyShardedObserver::Scope {
  explicit LabelScope(const std::string& what) : label(what) {}
  trace::CommLabel label;
};

struct SpanScope : FullyShardedObserver::Scope {
  explicit SpanScope(std::string name) : span(std::move(name)) {}
  trace::Span span;
};

}  // namespace

void FullyShardedTrace::layer_begins(size_t layer, Pass) { spans_.at(layer).open(); }

void FullyShardedTrace::layer_ends(size_t layer, Pass pass) {
  if (layer < spans_.size())  // an own unit's gradient ends no layer
    spans_[layer].close(str("layer ", layer, pass == Pass::kForward ? " forward" : " backward"));
}

std::unique_ptr<FullyShardedObserver::Scope> FullyShardedTrace::launching(size_t unit) {
  return std::make_unique<LabelScope>(str("unit ", unit));
}

std::unique_ptr<FullyShardedObserver::Scope> FullyShardedTrace::waiting(size_t unit, Collective c) {
  return std::make_unique<SpanScope>(c == Collective::kParamAllGather ? str("wait for param all-gather, unit ", unit)
                                                                      : std::string("wait for gradient reduce-scatter"));
}

}  // namespace loom::parallel
