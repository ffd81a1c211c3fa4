#include "parallel/pipeline_parallel/pipeline_channels.h"

#include <algorithm>

#include "autograd/variable.h"
#include "parallel/pipeline_parallel/send_release.h"
#include "tensor/ops.h"

namespace loom::parallel {

namespace {

// The header: [ndim, dtype, dim_0, ..., dim_{ndim-1}, zeros up to kMaxDims].
constexpr int64_t kMaxDims = 8;
constexpr int64_t kHeaderSize = 2 + kMaxDims;
static_assert(kHeaderSize * 8 == int64_t(kSendHeaderBytes), "send_release.h counts the header's bytes");
constexpr int kHeaderTag = 0, kPayloadTag = 1;
constexpr int kSender = 0, kReceiver = 1;  // group ranks in a channel

}  // namespace

Channel* PipelineChannels::open(ProcessGroup& pp_group, int from, int to, const std::string& name) {
  const int me = rank_;
  const bool member = me == from || me == to;
  std::unique_ptr<ProcessGroup> g = pp_group.split(member ? 0 : -1, me == from ? kSender : kReceiver, name);
  if (!member) return nullptr;
  channels_.push_back(std::make_unique<Channel>());
  channels_.back()->group = std::move(g);
  channels_.back()->stage = me == from ? to : from;
  return channels_.back().get();
}

uint64_t PipelineChannels::post(Channel& c, const Tensor& t, const char* verb, int mb, int chunk, bool hold) {
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
    Tensor h = from_vector(header);
    s.header = c.group->isend(h, kReceiver, kHeaderTag);
    if (hold) s.held_header = h;
    c.shape = payload.shape(), c.dtype = payload.dtype(), c.cached = in_schedule_;
  }
  s.payload = c.group->isend(payload, kReceiver, kPayloadTag);
  if (hold) s.held_payload = payload;
  s.ticket = ++tickets_;
  pending_.push_back(std::move(s));
  return tickets_;
}

Tensor PipelineChannels::recv(Channel& c, const char* verb, int mb, int chunk) {
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

void PipelineChannels::finish_sends() {
  if (!in_schedule_) {
    for (PendingSend& s : pending_) wait(s);
    pending_.clear();
    return;
  }
  // In a schedule: let go of the sends already delivered (and their payloads).
  // is_completed() is an MPI_Test, which moves every transfer of the process along.
  std::erase_if(pending_, [&](PendingSend& s) {
    if (s.held_payload.defined() || !s.payload->is_completed() || (s.header && !s.header->is_completed())) return false;
    wait(s);  // rethrows a failed send
    return true;
  });
}

void PipelineChannels::wait_send(uint64_t ticket) {
  auto it = std::find_if(pending_.begin(), pending_.end(), [&](const PendingSend& s) { return s.ticket == ticket; });
  if (it == pending_.end()) return;
  wait(*it);
  pending_.erase(it);
}

void PipelineChannels::wait(PendingSend& s) {
  if (s.header) s.header->wait();
  s.payload->wait();
  s.watch.done();
}

void PipelineChannels::begin_schedule() {
  pending_.clear();  // only a schedule that threw leaves sends behind (MPI keeps their payloads alive)
  forget_shapes();
  in_schedule_ = true;
}

void PipelineChannels::end_schedule() {
  in_schedule_ = false;
  finish_sends();  // every send delivered: the peers have received all of this step
  forget_shapes();
}

void PipelineChannels::forget_shapes() {
  for (auto& c : channels_) c->cached = false;
}

}  // namespace loom::parallel
