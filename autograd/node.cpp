#include "autograd/node.h"

namespace loom::autograd {

static std::atomic<uint64_t> g_next_sequence_nr{0};

Node::Node() : sequence_nr(g_next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}

TensorList FunctionNode::apply(TensorList&& grads) {
  LOOM_CHECK(backward_ != nullptr, name_,
             ": trying to backward through the graph a second time (its saved tensors were freed after the "
             "first backward; pass retain_graph=true the first time)");
  return backward_(grads);
}

}  // namespace loom::autograd
