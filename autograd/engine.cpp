#include "autograd/engine.h"

#include <queue>
#include <unordered_map>

#include "autograd/variable.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::autograd {

namespace {

// One backward pass's state (PyTorch's GraphTask): the callbacks queued during it.
struct GraphTask {
  std::vector<std::function<void()>> callbacks;
};
thread_local GraphTask* t_current_task = nullptr;

// A ready node and when it became ready. Highest sequence_nr runs first; ties
// (every AccumulateGrad has the maximum sequence_nr) run in the order they
// became ready, i.e. edge order within one node. Without the tie-break the
// heap's layout decided: cat(c0..c4) fired its hooks as c0, c3, c4, c1, c2.
struct ReadyNode {
  Node* node;
  uint64_t ready_nr;
};
struct ByPriority {  // true when a runs after b
  bool operator()(const ReadyNode& a, const ReadyNode& b) const {
    if (a.node->sequence_nr != b.node->sequence_nr) return a.node->sequence_nr < b.node->sequence_nr;
    return a.ready_nr > b.ready_nr;
  }
};

// True when nothing but this handle refers to t's memory (no other handle, no
// view, no saved tensor), so t may be overwritten. Contiguous, so no element
// is stored twice (an expand()ed gradient has stride-0 dims).
bool exclusively_owned(const Tensor& t) {
  return t.impl_ptr().use_count() == 1 && t.storage().use_count() == 1 && !t.impl()->autograd_meta &&
         t.is_contiguous();
}

// Sums gradients arriving at one node's inputs (its outputs in forward).
// When one of the two summands is a temporary that nobody else holds, the sum
// is written into it instead of a new tensor (PyTorch's InputBuffer does the
// same); a + b and b + a are the same float, so which one does not matter.
struct InputBuffer {
  TensorList grads;
  void add(int nr, Tensor g) {
    if (int(grads.size()) <= nr) grads.resize(size_t(nr) + 1);
    Tensor& slot = grads[size_t(nr)];
    if (!slot.defined()) {
      slot = std::move(g);
    } else if (slot.shape() == g.shape() && slot.dtype() == g.dtype() && exclusively_owned(slot)) {
      ops::add_(slot, g);
    } else if (slot.shape() == g.shape() && slot.dtype() == g.dtype() && exclusively_owned(g)) {
      ops::add_(g, slot);
      slot = std::move(g);
    } else {
      slot = ops::add(slot, g);
    }
  }
};

}  // namespace

bool Engine::in_backward() { return t_current_task != nullptr; }

void Engine::queue_callback(std::function<void()> fn) {
  LOOM_CHECK(t_current_task, "queue_callback: no backward pass is running on this thread (call it from a hook)");
  t_current_task->callbacks.push_back(std::move(fn));
}

void Engine::backward(const TensorList& outputs, const TensorList& grad_outputs, bool retain_graph) {
  LOOM_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(), "backward: ", outputs.size(),
             " outputs but ", grad_outputs.size(), " gradients");
  NoGradGuard no_grad;  // the backward functions themselves are not recorded

  // Roots: the nodes the output gradients enter.
  std::vector<std::pair<Edge, Tensor>> roots;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    Tensor g = grad_outputs.empty() ? Tensor() : grad_outputs[i];
    if (!g.defined()) {
      LOOM_CHECK(out.numel() == 1, "backward: output ", i, " has shape ", out.shape(),
                 "; a gradient can be implicitly created only for scalar outputs (pass grad_outputs)");
      g = ones(out.shape(), out.dtype(), out.device());
    }
    LOOM_CHECK(g.shape() == out.shape(), "backward: gradient ", g.shape(), " does not match output ", i, " of shape ",
               out.shape());
    // Otherwise the first backward function would fail on mixed dtypes, far from the cause.
    LOOM_CHECK(g.dtype() == out.dtype(), "backward: gradient ", i, " is ", g.describe(), " but output ", i, " is ",
               out.describe());
    Edge e = gradient_edge(out);
    LOOM_CHECK(e.valid(), "backward: output ", i, " (", out.describe(),
               ") does not require grad and has no grad_fn");
    roots.push_back({e, g});
  }

  // Count, for every node reachable from the roots, how many edges point at it.
  std::unordered_map<Node*, int> dependencies;
  std::vector<Node*> stack;
  std::unordered_map<Node*, bool> seen;
  for (auto& r : roots)
    if (!seen[r.first.fn.get()]) { seen[r.first.fn.get()] = true; stack.push_back(r.first.fn.get()); }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.valid()) continue;
      Node* m = e.fn.get();
      dependencies[m] += 1;
      if (!seen[m]) { seen[m] = true; stack.push_back(m); }
    }
  }

  // A backward called from inside a node's backward (a checkpointed region
  // rerunning its forward: autograd/checkpoint.h) is re-entrant: it runs its
  // own graph to the end here, but callbacks queued during it join the outer
  // pass's and run once, after the outer pass (PyTorch's queue_callback goes to
  // the graph task that started it all): data parallel's wait for its
  // all-reduces must not come before the rest of the model's gradients.
  GraphTask task;
  GraphTask* const outer = t_current_task;
  t_current_task = outer ? outer : &task;
  struct Reset {
    GraphTask* outer;
    ~Reset() { t_current_task = outer; }
  } reset{outer};

  std::unordered_map<Node*, InputBuffer> buffers;
  std::priority_queue<ReadyNode, std::vector<ReadyNode>, ByPriority> ready;
  uint64_t next_ready_nr = 0;
  auto make_ready = [&](Node* n) { ready.push({n, next_ready_nr++}); };
  // Keep every node alive while the pass runs (releasing saved tensors may drop
  // the last reference to an upstream node before we reach it).
  std::unordered_map<Node*, std::shared_ptr<Node>> alive;
  std::vector<Node*> root_nodes;
  for (auto& [e, g] : roots) {
    if (alive.emplace(e.fn.get(), e.fn).second) root_nodes.push_back(e.fn.get());
    buffers[e.fn.get()].add(e.input_nr, g);
  }
  for (Node* n : root_nodes)
    if (dependencies[n] == 0) make_ready(n);

  while (!ready.empty()) {
    Node* node = ready.top().node;
    ready.pop();
    TensorList inputs = std::move(buffers[node].grads);
    buffers.erase(node);
    inputs.resize(size_t(node->num_outputs));
    for (auto& h : node->pre_hooks)
      for (int i = 0; i < node->num_outputs; ++i)
        if (inputs[size_t(i)].defined()) h(inputs[size_t(i)], i);
    bool any = false;
    for (auto& g : inputs) any = any || g.defined();
    // No gradient reached this node (e.g. only an unused output): nothing to propagate.
    TensorList outs = any ? node->apply(std::move(inputs)) : TensorList{};
    if (!retain_graph) node->release_saved();
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.valid()) continue;
      Node* next = e.fn.get();
      alive.emplace(next, e.fn);
      if (i < outs.size() && outs[i].defined()) buffers[next].add(e.input_nr, std::move(outs[i]));
      if (--dependencies[next] == 0) make_ready(next);
    }
  }

  // Callbacks, including any queued by callbacks (the outermost pass's only).
  if (outer) return;
  for (size_t i = 0; i < task.callbacks.size(); ++i) {
    auto cb = std::move(task.callbacks[i]);
    cb();
  }
}

void backward(const Tensor& loss, bool retain_graph) { Engine::backward({loss}, {}, retain_graph); }

void backward(const TensorList& outputs, const TensorList& grad_outputs, bool retain_graph) {
  Engine::backward(outputs, grad_outputs, retain_graph);
}

}  // namespace loom::autograd
