#include "parallel/pipeline_parallel/pipeline_p2p.h"

#include <algorithm>

#include "autograd/variable.h"
#include "tensor/ops.h"

namespace loom::parallel {

namespace {

// The metadata header: [ndim, dtype, dim_0, ..., dim_{ndim-1}, zeros up to kMaxDims].
constexpr int64_t kMaxDims = 8;
constexpr int64_t kHeaderSize = 2 + kMaxDims;
constexpr int kHeaderTag = 0, kPayloadTag = 1;
// In a channel's two-rank group the sender is group rank 0, the receiver 1.
constexpr int kSender = 0, kReceiver = 1;

}  // namespace

// One direction of one link of the ring: `stage` is the pp rank at the other end.
struct PipelineP2P::Channel {
  std::unique_ptr<ProcessGroup> group;
  int stage = 0;
  bool cached = false;  // in a schedule, once the header has gone by
  Shape shape;
  DType dtype = kFloat32;
};

PipelineP2P::PipelineP2P(ProcessGroup& pp_group, ChunkLayout layout)
    : pp_group_(pp_group), rank_(pp_group.rank()), size_(pp_group.size()), layout_(layout) {
  if (size_ == 1) return;  // one stage: nothing to talk to
  // Link k: k -> k + 1 for activations, k -> k - 1 for gradients (around the
  // ring). Each split is collective over pp_group; the two ranks of the link
  // join it, the sender first.
  auto make = [&](int from, int to, const std::string& name, std::unique_ptr<Channel>& out,
                  std::unique_ptr<Channel>& in) {
    const bool member = rank_ == from || rank_ == to;
    std::unique_ptr<ProcessGroup> g = pp_group.split(member ? 0 : -1, rank_ == from ? kSender : kReceiver, name);
    if (!member) return;
    auto c = std::make_unique<Channel>();
    c->group = std::move(g);
    c->stage = rank_ == from ? to : from;
    (rank_ == from ? out : in) = std::move(c);
  };
  for (int k = 0; k < size_; ++k) {
    make(k, (k + 1) % size_, str(pp_group.name(), "_act", k), act_out_, act_in_);
    make(k, (k - 1 + size_) % size_, str(pp_group.name(), "_grad", k), grad_out_, grad_in_);
  }
  if (layout_ != ChunkLayout::V) return;
  // The V's chunk 1: activations k -> k - 1, gradients k - 1 -> k, no wrap-around.
  for (int k = 1; k < size_; ++k) {
    make(k, k - 1, str(pp_group.name(), "_act_up", k), act_up_out_, act_up_in_);
    make(k - 1, k, str(pp_group.name(), "_grad_up", k), grad_up_out_, grad_up_in_);
  }
}

PipelineP2P::~PipelineP2P() = default;

// ---- the verbs -------------------------------------------------------------------

Tensor PipelineP2P::recv_forward(int mb) {
  if (is_first_stage()) return Tensor();
  return recv(*act_in_, "recv_forward", mb, -1);
}

void PipelineP2P::send_forward(const Tensor& output, int mb) {
  if (is_last_stage()) return;
  send(*act_out_, output, "send_forward", mb, -1);
  finish_sends();
}

Tensor PipelineP2P::recv_backward(int mb) {
  if (is_last_stage()) return Tensor();
  return recv(*grad_in_, "recv_backward", mb, -1);
}

void PipelineP2P::send_backward(const Tensor& input_grad, int mb) {
  if (is_first_stage()) return;
  send(*grad_out_, input_grad, "send_backward", mb, -1);
  finish_sends();
}

// The send and the receive run on different channels, so the next stage's
// send_bwd_recv_fwd (gradient send, activation receive) meets both, whatever
// order they run in. The receive is posted before this waits for the send
// (outside a schedule; in one, nothing waits for it).
Tensor PipelineP2P::send_fwd_recv_bwd(const Tensor& output, int send_mb, int recv_mb) {
  if (is_last_stage()) return Tensor();
  send(*act_out_, output, "send_forward", send_mb, -1);
  Tensor grad = recv(*grad_in_, "recv_backward", recv_mb, -1);
  finish_sends();
  return grad;
}

Tensor PipelineP2P::send_bwd_recv_fwd(const Tensor& input_grad, int send_mb, int recv_mb) {
  if (is_first_stage()) return Tensor();
  send(*grad_out_, input_grad, "send_backward", send_mb, -1);
  Tensor input = recv(*act_in_, "recv_forward", recv_mb, -1);
  finish_sends();
  return input;
}

// ---- the ring --------------------------------------------------------------------

PipelineP2P::Channel& PipelineP2P::ring(const std::unique_ptr<Channel>& c, const char* verb) const {
  LOOM_CHECK(c != nullptr, verb, ": a pipeline of one stage has no ring to send around");
  return *c;
}

PipelineP2P::Channel& PipelineP2P::way(int chunk, const std::unique_ptr<Channel>& down,
                                        const std::unique_ptr<Channel>& up, const char* verb) const {
  return ring(layout_ == ChunkLayout::V && chunk == 1 ? up : down, verb);
}

Tensor PipelineP2P::take(Handoff& h, const char* verb, int mb) {
  LOOM_CHECK(!h.empty() && h.front().first == mb, verb, ": stage ", rank_, " turns the V with micro-batch ", mb,
             " but holds ", h.empty() ? std::string("nothing") : str("micro-batch ", h.front().first),
             " (a schedule out of order)");
  Tensor t = h.front().second;
  h.pop_front();
  return t;
}

Tensor PipelineP2P::recv_activation(int mb, int chunk) {
  if (turns_here(chunk - 1)) return take(turn_activations_, "recv_activation", mb);  // chunk 1 <- chunk 0
  return recv(way(chunk, act_in_, act_up_in_, "recv_activation"), "recv_activation", mb, chunk);
}

void PipelineP2P::send_activation(const Tensor& output, int mb, int chunk) {
  if (turns_here(chunk)) {  // chunk 0 -> chunk 1: a leaf of its own, as a received tensor would be
    turn_activations_.emplace_back(mb, autograd::detach(output));
    return;
  }
  send(way(chunk, act_out_, act_up_out_, "send_activation"), output, "send_activation", mb, chunk);
  finish_sends();
}

Tensor PipelineP2P::recv_gradient(int mb, int chunk) {
  if (turns_here(chunk)) return take(turn_gradients_, "recv_gradient", mb);  // chunk 0 <- chunk 1
  return recv(way(chunk, grad_in_, grad_up_in_, "recv_gradient"), "recv_gradient", mb, chunk);
}

void PipelineP2P::send_gradient(const Tensor& input_grad, int mb, int chunk) {
  if (turns_here(chunk - 1)) {  // chunk 1 -> chunk 0
    turn_gradients_.emplace_back(mb, input_grad);
    return;
  }
  send(way(chunk, grad_out_, grad_up_out_, "send_gradient"), input_grad, "send_gradient", mb, chunk);
  finish_sends();
}

// ---- a schedule's transfers ------------------------------------------------------

void PipelineP2P::begin_schedule() {
  pending_.clear();  // only a schedule that threw leaves sends behind (MPI keeps their payloads alive)
  turn_activations_.clear(), turn_gradients_.clear();
  forget_shapes();
  in_schedule_ = true;
}

void PipelineP2P::end_schedule() {
  in_schedule_ = false;
  finish_sends();  // every send delivered: the peers have received all of this step
  forget_shapes();
}

void PipelineP2P::forget_shapes() {
  for (Channel* c : {act_out_.get(), act_in_.get(), grad_out_.get(), grad_in_.get(), act_up_out_.get(),
                     act_up_in_.get(), grad_up_out_.get(), grad_up_in_.get()})
    if (c) c->cached = false;
}

void PipelineP2P::finish_sends() {
  if (!in_schedule_) {
    for (PendingSend& s : pending_) wait(s);
    pending_.clear();
    return;
  }
  // In a schedule: let go of the sends already delivered (and their payloads).
  // is_completed() is an MPI_Test, which moves every transfer of the process along.
  std::erase_if(pending_, [&](PendingSend& s) {
    if (!s.payload->is_completed() || (s.header && !s.header->is_completed())) return false;
    wait(s);  // rethrows a failed send
    return true;
  });
}

// ---- one transfer ----------------------------------------------------------------

void PipelineP2P::send(Channel& c, const Tensor& t, const char* verb, int mb, int chunk) {
  LOOM_CHECK(t.defined(), verb, ": stage ", rank_, ", micro-batch ", mb, ": the tensor to send is undefined");
  LOOM_CHECK(t.dim() <= kMaxDims, verb, ": ", t.describe(), " has more than ", kMaxDims, " dims");
  // Outside the graph (the sender keeps its own handle for backward), contiguous for MPI.
  Tensor payload = ops::contiguous(autograd::detach(t));
  PendingSend s;
  s.watch = log_.sent(verb, c.stage, mb, chunk, payload);  // LOOM_VERBOSE's line; the trace span to its delivery
  if (c.cached) {
    LOOM_CHECK(payload.shape() == c.shape && payload.dtype() == c.dtype, verb, ": stage ", rank_, " sends ",
               payload.describe(), " in a schedule whose first transfer on this channel was ", shape_str(c.shape),
               " ", dtype_name(c.dtype), "; every micro-batch of a step must have the same shape");
  } else {
    std::vector<int64_t> header(kHeaderSize, 0);
    header[0] = payload.dim();
    header[1] = int64_t(payload.dtype());
    for (int64_t d = 0; d < payload.dim(); ++d) header[size_t(2 + d)] = payload.size(d);
    s.header = c.group->isend(from_vector(header), kReceiver, kHeaderTag);
    c.shape = payload.shape(), c.dtype = payload.dtype(), c.cached = in_schedule_;
  }
  s.payload = c.group->isend(payload, kReceiver, kPayloadTag);
  pending_.push_back(std::move(s));
}

void PipelineP2P::wait(PendingSend& s) {
  if (s.header) s.header->wait();
  s.payload->wait();
  s.watch.done();
}

Tensor PipelineP2P::recv(Channel& c, const char* verb, int mb, int chunk) {
  TransferLog::Watch watch = log_.receiving(verb, mb, chunk);
  if (!c.cached) {
    Tensor header = zeros({kHeaderSize}, kInt64);
    c.group->irecv(header, kSender, kHeaderTag)->wait();
    std::vector<int64_t> h = header.to_vector<int64_t>();
    LOOM_CHECK(h[0] >= 0 && h[0] <= kMaxDims && h[1] >= 0 && h[1] <= int64_t(DType::Int64), verb, ": stage ",
               rank_, " got a malformed header from stage ", c.stage, " (ndim ", h[0], ", dtype ", h[1], ")");
    c.shape = Shape(h.begin() + 2, h.begin() + 2 + h[0]), c.dtype = DType(h[1]), c.cached = in_schedule_;
  }
  Tensor t = empty(c.shape, c.dtype, device_);
  c.group->irecv(t, kSender, kPayloadTag)->wait();  // on this thread: no hand-off to the channel's
  log_.received(watch, verb, c.stage, mb, t);
  return t;
}

}  // namespace loom::parallel
