#include "autograd/engine.h"

#include <algorithm>
#include <map>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "autograd/accumulate_grad.h"
#include "autograd/variable.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::autograd {

namespace {

// One backward pass's state (PyTorch's GraphTask): the callbacks queued during
// it, and in a B pass where the weights' gradient work goes.
struct GraphTask {
  std::vector<std::function<void()>> callbacks;
  WeightGrads* weight_grads = nullptr;
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

// Runs the callbacks queued during `task`, including any queued by callbacks.
void run_callbacks(GraphTask& task) {
  for (size_t i = 0; i < task.callbacks.size(); ++i) {
    auto cb = std::move(task.callbacks[i]);
    cb();
  }
}

}  // namespace

bool Engine::in_backward() { return t_current_task != nullptr; }

void Engine::queue_callback(std::function<void()> fn) {
  LOOM_CHECK(t_current_task, "queue_callback: no backward pass is running on this thread (call it from a hook)");
  t_current_task->callbacks.push_back(std::move(fn));
}


void Engine::backward(const TensorList& outputs, const TensorList& grad_outputs, bool retain_graph,
                      const TensorList& inputs) {
  run_backward(outputs, grad_outputs, retain_graph, inputs, nullptr);
}

WeightGrads Engine::backward_input(const TensorList& outputs, const TensorList& grad_outputs,
                                   const TensorList& inputs) {
  LOOM_CHECK(!in_backward(), "backward_input: called inside a backward pass (a B pass is not re-entrant)");
  WeightGrads w;
  run_backward(outputs, grad_outputs, /*retain_graph=*/false, inputs, &w);
  return w;
}

void Engine::run_backward(const TensorList& outputs, const TensorList& grad_outputs, bool retain_graph,
                          const TensorList& inputs, WeightGrads* weight_grads) {
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
  task.weight_grads = weight_grads;
  GraphTask* const outer = t_current_task;
  t_current_task = outer ? outer : &task;
  struct Reset {
    GraphTask* outer;
    ~Reset() { t_current_task = outer; }
  } reset{outer};
  // In a B pass (this one or the outer one), a weight's AccumulateGrad is
  // left for W: it never becomes ready here, and what reaches it is recorded.
  WeightGrads* const w = t_current_task->weight_grads;
  const int pass = w ? w->passes_++ : 0;
  std::unordered_set<Node*> wanted;  // the leaves whose gradients B computes
  for (const Tensor& t : inputs)
    if (Edge e = gradient_edge(t); e.valid()) wanted.insert(e.fn.get());
  auto deferred = [&](Node* n) { return w && !wanted.count(n) && dynamic_cast<AccumulateGrad*>(n); };

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
    // A separable node whose weights all wait for W computes its inputs' gradients only.
    const size_t n_edges = node->next_edges.size(), n_weights = size_t(node->num_weight_edges());
    bool split = w && any && n_weights > 0;
    for (size_t i = n_edges - n_weights; split && i < n_edges; ++i)
      split = !node->next_edges[i].valid() || deferred(node->next_edges[i].fn.get());
    WeightGrads::Work computed, later;
    computed.pass = later.pass = pass;
    if (w) computed.op = later.op = node->name();
    if (split) {  // W's work: one gradient per weight edge, in edge order
      later.compute = node->weight_work(inputs);
      later.edges.assign(node->next_edges.end() - std::ptrdiff_t(n_weights), node->next_edges.end());
    }
    // No gradient reached this node (e.g. only an unused output): nothing to propagate.
    TensorList outs = split ? node->apply_input(inputs) : any ? node->apply(std::move(inputs)) : TensorList{};
    if (!retain_graph) node->release_saved();
    for (size_t i = 0; i < n_edges; ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.valid()) continue;
      Node* next = e.fn.get();
      Tensor g = i < outs.size() ? std::move(outs[i]) : Tensor();
      if (deferred(next)) {  // a weight: its gradient (or, for split's weight edges, the work for it) waits for W
        if (!split || i < n_edges - n_weights) {
          computed.edges.push_back(e);
          computed.grads.push_back(std::move(g));
        }
        continue;
      }
      alive.emplace(next, e.fn);
      if (g.defined()) buffers[next].add(e.input_nr, std::move(g));
      if (--dependencies[next] == 0) make_ready(next);
    }
    for (WeightGrads::Work* work : {&computed, &later})
      if (!work->edges.empty()) w->work_.push_back(std::move(*work));
  }

  // Callbacks, including any queued by callbacks (the outermost pass's only).
  if (!outer) run_callbacks(task);
}

std::vector<std::string> WeightGrads::ops(bool deferred) const {
  std::vector<std::string> out;
  for (const Work& w : work_)
    if (bool(w.compute) == deferred && std::find(out.begin(), out.end(), w.op) == out.end()) out.push_back(w.op);
  return out;
}

// W: the work in B's order. Each weight's AccumulateGrad runs once the last
// of its gradients (in its pass) is in, as in backward(): the same sums in
// the same order, the same hooks in the same order.
void Engine::run_weight_grads(WeightGrads& weight_grads) {
  LOOM_CHECK(!in_backward(), "run_weight_grads: called inside a backward pass");
  NoGradGuard no_grad;
  GraphTask task;  // hooks may queue callbacks (data parallel's wait for its buckets)
  t_current_task = &task;
  struct Reset {
    ~Reset() { t_current_task = nullptr; }
  } reset;
  std::vector<WeightGrads::Work> work = std::move(weight_grads.work_);
  weight_grads = WeightGrads();
  using Key = std::pair<int, Node*>;  // (pass, AccumulateGrad)
  std::map<Key, int> pending;         // gradients still to come
  for (const auto& piece : work)
    for (const Edge& e : piece.edges)
      if (e.valid()) pending[{piece.pass, e.fn.get()}] += 1;
  std::map<Key, InputBuffer> buffers;
  for (auto& piece : work) {
    TensorList grads = piece.compute ? piece.compute() : std::move(piece.grads);
    piece.compute = nullptr;  // frees X and dY
    for (size_t i = 0; i < piece.edges.size(); ++i) {
      const Edge& e = piece.edges[i];
      if (!e.valid()) continue;  // an undefined bias
      const Key key{piece.pass, e.fn.get()};
      if (i < grads.size() && grads[i].defined()) buffers[key].add(e.input_nr, std::move(grads[i]));
      if (--pending[key] > 0) continue;
      TensorList inputs = std::move(buffers[key].grads);
      buffers.erase(key);
      inputs.resize(size_t(e.fn->num_outputs));
      for (auto& h : e.fn->pre_hooks)
        if (inputs[0].defined()) h(inputs[0], 0);
      if (inputs[0].defined()) e.fn->apply(std::move(inputs));  // accumulates; its hooks fire
    }
  }
  run_callbacks(task);
}

void backward(const Tensor& loss, bool retain_graph) { Engine::backward({loss}, {}, retain_graph); }

void backward(const TensorList& outputs, const TensorList& grad_outputs, bool retain_graph) {
  Engine::backward(outputs, grad_outputs, retain_graph);
}

}  // namespace loom::autograd
