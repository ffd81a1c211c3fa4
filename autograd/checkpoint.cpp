#include "autograd/checkpoint.h"

#include <utility>

#include "autograd/engine.h"
#include "autograd/variable.h"
#include "tensor/grad_mode.h"

namespace loom::autograd {

namespace {

// While alive, ops record graph nodes (the rerun inside the engine's NoGradGuard).
struct EnableGradGuard {
  bool prev = GradMode::is_enabled();
  EnableGradGuard() { GradMode::set_enabled(true); }
  ~EnableGradGuard() { GradMode::set_enabled(prev); }
};

// Puts the generators at the offsets of the first run for the rerun, and back
// where they were after it.
struct RngReplay {
  std::vector<PhiloxGenerator*> gens;
  std::vector<uint64_t> now;
  RngReplay(const std::vector<PhiloxGenerator*>& g, const std::vector<uint64_t>& then) : gens(g) {
    for (size_t i = 0; i < gens.size(); ++i) now.push_back(std::exchange(gens[i]->offset, then[i]));
  }
  ~RngReplay() {
    for (size_t i = 0; i < gens.size(); ++i) gens[i]->offset = now[i];
  }
};

// The region's backward: one output gradient per output of fn, one input
// gradient per input.
struct CheckpointNode : Node {
  CheckpointFn fn;
  TensorList inputs;                  // detached: the values, not the graph above
  std::vector<bool> input_requires_grad;
  std::vector<PhiloxGenerator*> rng;
  std::vector<uint64_t> rng_offsets;  // where the region's first run started drawing
  bool freed = false;                 // the inputs were released after a backward

  std::string name() const override { return "CheckpointBackward"; }
  void release_saved() override {
    inputs.clear();
    freed = true;
  }

  TensorList apply(TensorList&& grads) override {
    LOOM_CHECK(!freed,
               "checkpoint: backward ran twice through a checkpointed region (its inputs were freed after the "
               "first; pass retain_graph)");
    // The region again, on leaves that stand for its inputs, recorded this time.
    TensorList leaves;
    for (size_t i = 0; i < inputs.size(); ++i) {
      leaves.push_back(detach(inputs[i]));
      if (input_requires_grad[i]) set_requires_grad(leaves.back());
    }
    TensorList outputs;
    {
      EnableGradGuard grad_on;
      RngReplay same_masks(rng, rng_offsets);
      outputs = fn(leaves);
    }
    // Back-propagate the incoming gradients through the rebuilt graph: a
    // backward inside this one (the engine is re-entrant; queued callbacks
    // wait for the outer pass). The params' AccumulateGrad nodes run here -
    // or, in a zero-bubble B pass (engine.h), in its W; the leaves' run here.
    TensorList roots, root_grads;
    for (size_t i = 0; i < outputs.size() && i < grads.size(); ++i)
      if (grads[i].defined() && gradient_edge(outputs[i]).valid()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(std::move(grads[i]));
      }
    if (!roots.empty()) Engine::backward(roots, root_grads, /*retain_graph=*/false, /*inputs=*/leaves);
    TensorList input_grads;
    for (size_t i = 0; i < leaves.size(); ++i) input_grads.push_back(input_requires_grad[i] ? grad(leaves[i]) : Tensor());
    return input_grads;
  }
};

}  // namespace

TensorList checkpoint(const CheckpointFn& fn, const TensorList& inputs, std::vector<PhiloxGenerator*> rng) {
  bool any = false;
  for (const Tensor& x : inputs) {
    LOOM_CHECK(x.defined(), "checkpoint: input ", &x - inputs.data(), " of ", inputs.size(), " is undefined");
    any = any || requires_grad(x);
  }
  if (!GradMode::is_enabled() || !any) return fn(inputs);

  auto node = std::make_shared<CheckpointNode>();
  node->fn = fn;
  for (PhiloxGenerator* g : rng) node->rng_offsets.push_back(g->offset);
  node->rng = std::move(rng);
  TensorList outputs;
  {
    NoGradGuard no_grad;  // the region's graph is not kept: only its inputs are
    outputs = fn(inputs);
  }
  for (const Tensor& x : inputs) {
    node->inputs.push_back(detach(x));
    node->input_requires_grad.push_back(requires_grad(x));
    node->next_edges.push_back(gradient_edge(x));
  }
  node->num_outputs = int(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    // An output that is an input itself (fn passed it through) gets a handle of its own.
    for (const Tensor& x : inputs)
      if (outputs[i].is_same(x)) outputs[i] = outputs[i].alias();
    if (!is_floating(outputs[i].dtype())) continue;  // token ids and the like carry no gradient
    AutogradMeta& m = meta(outputs[i]);
    m.grad_fn = node;
    m.output_nr = int(i);
  }
  return outputs;
}

}  // namespace loom::autograd
