// The backward engine. Given output tensors and their gradients it runs the
// graph's nodes in dependency order on the calling thread. Ready nodes run
// highest sequence_nr first (latest-created first; AccumulateGrad as soon as it
// is ready), ties in the order they became ready, so the order is the same on
// every run and every rank - bucketed data parallelism relies on this.
//
// Zero-bubble pipelines (Qi et al. 2024, "Zero Bubble Pipeline Parallelism")
// split a stage's backward in two, and so can the engine:
//   B  backward_input(outputs, grads, inputs): the gradients of `inputs`
//      (what the previous stage waits for) and of everything in between.
//      Each weight's gradient is left as work for later: a separable node's
//      (Node::num_weight_edges(): linear, embedding) is not computed at all -
//      its W keeps X and dY -; any other node's is computed now and waits.
//   W  run_weight_grads(w): computes what B left, sums each weight's parts in
//      the order backward() would have, and runs each AccumulateGrad then:
//      its hooks (data parallel's buckets, ZeRO's reduce-scatters) fire in W,
//      not in B. The gradients are backward()'s, bit for bit.
// PyTorch's pipelining does the same with stage_backward_input /
// stage_backward_weight, outside its engine.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "autograd/node.h"

namespace loom::autograd {

// The weight-gradient work a B pass left (see above), in the order B found it.
class WeightGrads {
 public:
  bool empty() const { return work_.empty(); }
  // How many pieces of work: one per separable node, one per other node whose gradient reached a weight.
  size_t size() const { return work_.size(); }
  // The ops that left work, in order, each once: deferred = true lists the
  // separable ones (their weight gradient is computed in W), false the others
  // (computed in B, accumulated in W).
  std::vector<std::string> ops(bool deferred) const;

 private:
  friend class Engine;
  struct Work {
    std::function<TensorList()> compute;  // a separable node's W; null when B computed `grads`
    TensorList grads;
    std::vector<Edge> edges;  // where each gradient goes: a weight's AccumulateGrad
    int pass = 0;             // which backward (a checkpointed region's rerun is its own)
    std::string op;           // the node's name
  };
  std::vector<Work> work_;
  int passes_ = 0;
};

class Engine {
 public:
  // Back-propagates grad_outputs from outputs. A scalar output may omit its
  // gradient (1 is used); a non-scalar needs one. The graph is freed unless
  // retain_graph. May be called from inside a node's backward (re-entrant: a
  // checkpointed region, autograd/checkpoint.h); its queued callbacks then
  // run after the outer pass.
  // inputs: leaves whose .grad the caller reads as soon as this returns (a
  // checkpointed region's stand-ins for its inputs); only inside a B pass does
  // it matter: their gradients are computed now, not left for W.
  static void backward(const TensorList& outputs, const TensorList& grad_outputs = {}, bool retain_graph = false,
                       const TensorList& inputs = {});

  // B: like backward(), but every leaf except `inputs` (the stage's input,
  // whose .grad this leaves set) gets its gradient only in W. Not re-entrant.
  static WeightGrads backward_input(const TensorList& outputs, const TensorList& grad_outputs,
                                    const TensorList& inputs);
  // W: runs what a B pass left, then the callbacks its hooks queued. Empties w.
  static void run_weight_grads(WeightGrads& w);

  // fn runs once after the current backward pass has finished (after every
  // node and hook; the outermost pass, when re-entrant). Callbacks queued by
  // hooks or by other callbacks run in the same pass. PyTorch:
  // Variable._execution_engine.queue_callback.
  static void queue_callback(std::function<void()> fn);

  // True while a backward pass (or W) runs on this thread.
  static bool in_backward();

 private:
  // weight_grads: non-null for a B pass.
  static void run_backward(const TensorList& outputs, const TensorList& grad_outputs, bool retain_graph,
                           const TensorList& inputs, WeightGrads* weight_grads);
};

// loss.backward() for a scalar loss.
void backward(const Tensor& loss, bool retain_graph = false);
// Non-scalar outputs with explicit gradients (a pipeline stage back-propagating
// the gradient it received).
void backward(const TensorList& outputs, const TensorList& grad_outputs, bool retain_graph = false);

}  // namespace loom::autograd
