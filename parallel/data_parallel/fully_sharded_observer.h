// FullyShardedObserver: what a ZeRO-3 step (fully_sharded.h) tells whoever
// watches it, so that fully_sharded.cpp says what happens and not how it is
// drawn: when a layer computes (from its units' gather to its forward hook,
// or to its unit's last gradient in backward), which unit each collective is
// launched for, and where compute waits for one. This default watches nothing;
// --trace's (fully_sharded_trace.h) draws them on the timeline, and is passed
// in one level up (wrap.cpp) when tracing is on.
#pragma once

#include <cstddef>
#include <memory>

namespace loom::parallel {

class FullyShardedObserver {
 public:
  enum class Pass { kForward, kBackward };
  enum class Collective { kParamAllGather, kGradReduceScatter };
  // What an observer keeps over a launch or a wait (a trace label, a span): ends when destroyed.
  struct Scope {
    virtual ~Scope() = default;
  };

  virtual ~FullyShardedObserver() = default;
  // Layer `layer`'s units are gathered: its forward or backward computes from here ...
  virtual void layer_begins(size_t /*layer*/, Pass) {}
  // ... to here (forward: its forward hook; backward: unit `layer`'s last gradient, which an
  // own unit - past the layers - also reports: no layer began).
  virtual void layer_ends(size_t /*layer*/, Pass) {}
  // Every collective launched while the returned scope lives is for unit `unit`.
  virtual std::unique_ptr<Scope> launching(size_t /*unit*/) { return nullptr; }
  // Compute waits for unit `unit`'s collective while the returned scope lives.
  virtual std::unique_ptr<Scope> waiting(size_t /*unit*/, Collective) { return nullptr; }
};

}  // namespace loom::parallel
