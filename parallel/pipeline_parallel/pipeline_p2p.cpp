#include "parallel/pipeline_parallel/pipeline_p2p.h"

#include <cstdio>
#include <cstdlib>

#include "autograd/variable.h"
#include "parallel/comm/distributed.h"
#include "parallel/trace/trace.h"
#include "tensor/ops.h"

namespace loom::parallel {

namespace {

// The metadata header: [ndim, dtype, dim_0, ..., dim_{ndim-1}, zeros up to kMaxDims].
constexpr int64_t kMaxDims = 8;
constexpr int64_t kHeaderSize = 2 + kMaxDims;
constexpr int kHeaderTag = 0, kPayloadTag = 1;

std::string span_name(const char* verb, int mb) { return str(verb, " mb", mb); }

}  // namespace

PipelineP2P::PipelineP2P(ProcessGroup& pp_group)
    : pp_group_(pp_group), rank_(pp_group.rank()), size_(pp_group.size()) {
  fwd_group_ = pp_group.split(0, rank_, pp_group.name() + "_fwd");
  bwd_group_ = pp_group.split(0, rank_, pp_group.name() + "_bwd");
  const char* v = std::getenv("LOOM_VERBOSE");
  verbose_ = v && *v && std::string(v) != "0";
}

// ---- the verbs -------------------------------------------------------------------

Tensor PipelineP2P::recv_forward(int mb) {
  if (is_first_stage()) return Tensor();
  return recv(*fwd_group_, rank_ - 1, "recv_forward", mb);
}

void PipelineP2P::send_forward(const Tensor& output, int mb) {
  if (is_last_stage()) return;
  PendingSend s = post_send(*fwd_group_, rank_ + 1, output, "send_forward", mb);
  wait(s);
}

Tensor PipelineP2P::recv_backward(int mb) {
  if (is_last_stage()) return Tensor();
  return recv(*bwd_group_, rank_ + 1, "recv_backward", mb);
}

void PipelineP2P::send_backward(const Tensor& input_grad, int mb) {
  if (is_first_stage()) return;
  PendingSend s = post_send(*bwd_group_, rank_ - 1, input_grad, "send_backward", mb);
  wait(s);
}

// The send is queued on the activation group and the receive on the gradient
// group, so the next stage's send_bwd_recv_fwd (gradient send, activation
// receive) meets both, whatever order the two threads run them in.
Tensor PipelineP2P::send_fwd_recv_bwd(const Tensor& output, int send_mb, int recv_mb) {
  if (is_last_stage()) return Tensor();
  PendingSend s = post_send(*fwd_group_, rank_ + 1, output, "send_forward", send_mb);
  Tensor grad = recv(*bwd_group_, rank_ + 1, "recv_backward", recv_mb);
  wait(s);
  return grad;
}

Tensor PipelineP2P::send_bwd_recv_fwd(const Tensor& input_grad, int send_mb, int recv_mb) {
  if (is_first_stage()) return Tensor();
  PendingSend s = post_send(*bwd_group_, rank_ - 1, input_grad, "send_backward", send_mb);
  Tensor input = recv(*fwd_group_, rank_ - 1, "recv_forward", recv_mb);
  wait(s);
  return input;
}

// ---- one transfer ----------------------------------------------------------------

PipelineP2P::PendingSend PipelineP2P::post_send(ProcessGroup& group, int peer, const Tensor& t, const char* verb,
                                                int mb) {
  LOOM_CHECK(t.defined(), verb, ": stage ", rank_, ", micro-batch ", mb, ": the tensor to send is undefined");
  LOOM_CHECK(t.dim() <= kMaxDims, verb, ": ", t.describe(), " has more than ", kMaxDims, " dims");
  // Outside the graph (the sender keeps its own handle for backward), contiguous for MPI.
  Tensor payload = ops::contiguous(autograd::detach(t));
  std::vector<int64_t> header(kHeaderSize, 0);
  header[0] = payload.dim();
  header[1] = int64_t(payload.dtype());
  for (int64_t d = 0; d < payload.dim(); ++d) header[size_t(2 + d)] = payload.size(d);
  if (verbose_)
    std::fprintf(stderr, "[rank %d] %s -> stage %d mb %d %s %s\n", world().rank(), verb, peer, mb,
                 shape_str(payload.shape()).c_str(), dtype_name(payload.dtype()));
  PendingSend s;
  s.start_us = trace::enabled() ? trace::now_us() : 0;
  s.span = span_name(verb, mb);
  s.header = group.send_async(from_vector(header), peer, kHeaderTag);
  s.payload = group.send_async(payload, peer, kPayloadTag);
  return s;
}

void PipelineP2P::wait(PendingSend& s) {
  s.header->wait();
  s.payload->wait();
  if (trace::enabled()) trace::record(s.span, s.start_us, trace::now_us(), trace::kComm);
}

Tensor PipelineP2P::recv(ProcessGroup& group, int peer, const char* verb, int mb) {
  const double start = trace::enabled() ? trace::now_us() : 0;
  Tensor header = zeros({kHeaderSize}, kInt64);
  group.recv(header, peer, kHeaderTag);
  std::vector<int64_t> h = header.to_vector<int64_t>();
  LOOM_CHECK(h[0] >= 0 && h[0] <= kMaxDims && h[1] >= 0 && h[1] <= int64_t(DType::Int64), verb, ": stage ", rank_,
             " got a malformed header from stage ", peer, " (ndim ", h[0], ", dtype ", h[1], ")");
  Tensor t = empty(Shape(h.begin() + 2, h.begin() + 2 + h[0]), DType(h[1]));
  group.recv(t, peer, kPayloadTag);
  if (verbose_)
    std::fprintf(stderr, "[rank %d] %s <- stage %d mb %d %s %s\n", world().rank(), verb, peer, mb,
                 shape_str(t.shape()).c_str(), dtype_name(t.dtype()));
  if (trace::enabled()) trace::record(span_name(verb, mb), start, trace::now_us(), trace::kComm);
  return t;
}

}  // namespace loom::parallel
