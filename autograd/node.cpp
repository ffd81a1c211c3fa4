#include "autograd/node.h"

namespace loom::autograd {

static std::atomic<uint64_t> g_next_sequence_nr{0};

Node::Node() : sequence_nr(g_next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}

TensorList Node::apply_input(const TensorList&) {
  throw Error(str(name(), ": has no weight edges to leave for later (num_weight_edges() is 0)"));
}

std::function<TensorList()> Node::weight_work(const TensorList&) {
  throw Error(str(name(), ": has no weight edges to leave for later (num_weight_edges() is 0)"));
}

void FunctionNode::check_not_released() const {
  LOOM_CHECK(backward_ != nullptr, name_,
             ": trying to backward through the graph a second time (its saved tensors were freed after the "
             "first backward; pass retain_graph=true the first time)");
}

TensorList FunctionNode::apply(TensorList&& grads) {
  check_not_released();
  if (!weight_backward_) return backward_(grads);
  // A separable op: its inputs' gradients, then its weights', as B and W compute them.
  TensorList all = backward_(grads), weights = weight_backward_(grads);
  all.insert(all.end(), weights.begin(), weights.end());
  return all;
}

TensorList FunctionNode::apply_input(const TensorList& grads) {
  check_not_released();
  return backward_(grads);
}

std::function<TensorList()> FunctionNode::weight_work(const TensorList& grads) {
  check_not_released();
  // A copy of the closure (and of what it captured: X), and the gradients (dY):
  // release_saved() may free the node's own before W runs.
  return [fn = weight_backward_, grads] { return fn(grads); };
}

}  // namespace loom::autograd
