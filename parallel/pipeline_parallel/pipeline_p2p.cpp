#include "parallel/pipeline_parallel/pipeline_p2p.h"

#include "autograd/variable.h"

namespace loom::parallel {

PipelineP2P::PipelineP2P(ProcessGroup& pp_group, ChunkLayout layout)
    : pp_group_(pp_group), rank_(pp_group.rank()), size_(pp_group.size()), layout_(layout), channels_(rank_) {
  if (size_ == 1) return;  // one stage: nothing to talk to
  // Link k: k -> k + 1 for activations, k -> k - 1 for gradients (around the ring).
  auto open = [&](int from, int to, const char* what, int k, Channel*& out, Channel*& in) {
    Channel* c = channels_.open(pp_group, from, to, str(pp_group.name(), what, k));
    if (c) (rank_ == from ? out : in) = c;
  };
  for (int k = 0; k < size_; ++k) {
    open(k, (k + 1) % size_, "_act", k, act_out_, act_in_);
    open(k, (k - 1 + size_) % size_, "_grad", k, grad_out_, grad_in_);
  }
  if (layout_ != ChunkLayout::V) return;
  // The V's chunk 1: activations k -> k - 1, gradients k - 1 -> k, no wrap-around.
  for (int k = 1; k < size_; ++k) {
    open(k, k - 1, "_act_up", k, act_up_out_, act_up_in_);
    open(k - 1, k, "_grad_up", k, grad_up_out_, grad_up_in_);
  }
}

// The send and the receive run on different channels, so the next stage's
// send_bwd_recv_fwd (gradient send, activation receive) meets both in either order.
Tensor PipelineP2P::send_fwd_recv_bwd(const Tensor& output, int send_mb, int recv_mb) {
  if (is_last_stage()) return Tensor();
  post_forward(output, send_mb, false);
  Tensor grad = recv_backward(recv_mb);
  channels_.finish_sends();
  return grad;
}

Tensor PipelineP2P::send_bwd_recv_fwd(const Tensor& input_grad, int send_mb, int recv_mb) {
  if (is_first_stage()) return Tensor();
  post_backward(input_grad, send_mb, false);
  Tensor input = recv_forward(recv_mb);
  channels_.finish_sends();
  return input;
}

Channel& PipelineP2P::way(int chunk, Channel* down, Channel* up, const char* verb) const {
  Channel* c = layout_ == ChunkLayout::V && chunk == 1 ? up : down;
  LOOM_CHECK(c != nullptr, verb, ": a pipeline of one stage has no ring to send around");
  return *c;
}

Tensor PipelineP2P::recv_activation(int mb, int chunk) {
  if (turns_here(chunk - 1)) return turn_activations_.take("recv_activation", rank_, mb);  // chunk 1 <- chunk 0
  return channels_.recv(way(chunk, act_in_, act_up_in_, "recv_activation"), "recv_activation", mb, chunk);
}

uint64_t PipelineP2P::post_activation(const Tensor& output, int mb, int chunk, bool hold) {
  if (turns_here(chunk)) {  // chunk 0 -> chunk 1: a leaf of its own, as a received tensor would be
    turn_activations_.put(mb, autograd::detach(output));
    return 0;
  }
  return channels_.post(way(chunk, act_out_, act_up_out_, "send_activation"), output, "send_activation", mb, chunk,
                        hold);
}

Tensor PipelineP2P::recv_gradient(int mb, int chunk) {
  if (turns_here(chunk)) return turn_gradients_.take("recv_gradient", rank_, mb);  // chunk 0 <- chunk 1
  return channels_.recv(way(chunk, grad_in_, grad_up_in_, "recv_gradient"), "recv_gradient", mb, chunk);
}

uint64_t PipelineP2P::post_gradient(const Tensor& input_grad, int mb, int chunk, bool hold) {
  if (turns_here(chunk - 1)) {  // chunk 1 -> chunk 0
    turn_gradients_.put(mb, input_grad);
    return 0;
  }
  return channels_.post(way(chunk, grad_out_, grad_up_out_, "send_gradient"), input_grad, "send_gradient", mb, chunk,
                        hold);
}

}  // namespace loom::parallel
