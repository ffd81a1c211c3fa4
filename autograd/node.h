// Graph nodes. Every differentiable op records a Node (its backward) whose
// edges point at the nodes of its inputs; a leaf that requires grad ends in one
// AccumulateGrad node. Modelled on PyTorch's torch::autograd::Node.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace loom::autograd {

struct Node;

// Where a gradient flows: input number `input_nr` of node `fn`.
struct Edge {
  std::shared_ptr<Node> fn;
  int input_nr = 0;
  bool valid() const { return fn != nullptr; }
};

using TensorList = std::vector<Tensor>;

struct Node : std::enable_shared_from_this<Node> {
  Node();
  virtual ~Node() = default;

  // Gradients w.r.t. this node's outputs -> gradients w.r.t. its inputs (one
  // per next_edge; undefined where no gradient flows).
  virtual TensorList apply(TensorList&& grads) = 0;
  virtual std::string name() const = 0;
  // Frees saved tensors after backward (unless retain_graph).
  virtual void release_saved() {}

  // Zero-bubble's B/W split (engine.h). A node whose last num_weight_edges()
  // edges are weights, and whose weight gradients need nothing its input
  // gradients compute (a linear's dW = dYᵀ X), can run in two halves:
  // apply_input() returns the gradients of the other edges now (B), and
  // weight_work() the work that returns the weights' gradients later (W), one
  // per weight edge, holding what it needs (X and dY). apply() = both at once.
  virtual int num_weight_edges() const { return 0; }
  virtual TensorList apply_input(const TensorList& grads);
  virtual std::function<TensorList()> weight_work(const TensorList& grads);

  // Hooks run on the gradient of one of this node's outputs before apply
  // (how retain_grad() keeps a non-leaf's gradient).
  std::vector<std::function<void(const Tensor& grad, int output_nr)>> pre_hooks;

  std::vector<Edge> next_edges;
  // Creation order. The engine runs ready nodes highest sequence_nr first, so
  // the same graph always executes in the same order on every rank.
  uint64_t sequence_nr;
  int num_outputs = 1;
  bool released = false;
};

// The backward of an ordinary op: a closure over what the op saved. A
// separable op (function.h's record_split) gives two: backward_ returns the
// gradients of its inputs, weight_backward_ those of its last num_weights_
// edges, the weights.
struct FunctionNode : Node {
  using BackwardFn = std::function<TensorList(const TensorList& grads)>;
  FunctionNode(std::string name, BackwardFn fn, BackwardFn weight_fn = nullptr, int num_weights = 0)
      : name_(std::move(name)), backward_(std::move(fn)), weight_backward_(std::move(weight_fn)),
        num_weights_(num_weights) {}
  TensorList apply(TensorList&& grads) override;
  std::string name() const override { return name_; }
  void release_saved() override { backward_ = weight_backward_ = nullptr; }
  int num_weight_edges() const override { return num_weights_; }
  TensorList apply_input(const TensorList& grads) override;
  std::function<TensorList()> weight_work(const TensorList& grads) override;

 private:
  void check_not_released() const;
  std::string name_;
  BackwardFn backward_, weight_backward_;
  int num_weights_;
};

}  // namespace loom::autograd
