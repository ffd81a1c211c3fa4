// The backward engine. Given output tensors and their gradients it runs the
// graph's nodes in dependency order on the calling thread. Ready nodes run
// highest sequence_nr first (latest-created first; AccumulateGrad as soon as it
// is ready), ties in the order they became ready, so the order is the same on
// every run and every rank - bucketed data parallelism relies on this.
#pragma once

#include <functional>
#include <vector>

#include "autograd/node.h"

namespace loom::autograd {

class Engine {
 public:
  // Back-propagates grad_outputs from outputs. A scalar output may omit its
  // gradient (1 is used); a non-scalar needs one. The graph is freed unless
  // retain_graph. May be called from inside a node's backward (re-entrant: a
  // checkpointed region, autograd/checkpoint.h); its queued callbacks then
  // run after the outer pass.
  static void backward(const TensorList& outputs, const TensorList& grad_outputs = {}, bool retain_graph = false);

  // fn runs once after the current backward pass has finished (after every
  // node and hook; the outermost pass, when re-entrant). Callbacks queued by
  // hooks or by other callbacks run in the same pass. PyTorch:
  // Variable._execution_engine.queue_callback.
  static void queue_callback(std::function<void()> fn);

  // True while a backward pass runs on this thread.
  static bool in_backward();
};

// loss.backward() for a scalar loss.
void backward(const Tensor& loss, bool retain_graph = false);
// Non-scalar outputs with explicit gradients (a pipeline stage back-propagating
// the gradient it received).
void backward(const TensorList& outputs, const TensorList& grad_outputs, bool retain_graph = false);

}  // namespace loom::autograd
