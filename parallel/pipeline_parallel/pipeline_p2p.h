// Point-to-point communication between neighbouring pipeline stages, with
// picotron's plain verbs (pipeline_parallel.py: pipeline_communicate,
// bidirectional_pipeline_communicate; Megatron's p2p_communication.py):
//
//   recv_forward    activation  <- previous stage      send_forward   activation -> next stage
//   recv_backward   gradient    <- next stage          send_backward  gradient   -> previous stage
//   send_fwd_recv_bwd  (1F1B steady state: activation -> next, then its gradient <- next)
//   send_bwd_recv_fwd  (gradient -> previous, then the next activation <- previous)
//
// At the ends of the pipeline the verbs that would cross it do nothing: the
// first stage receives no activation (it reads token ids), the last sends none.
// The interleaved schedule (interleaved_schedule.h) also crosses the ends: the
// last rank's chunk c feeds the first rank's chunk c + 1. Its verbs take the
// ring, rank p - 1's next being rank 0, and always transfer:
//   recv_activation / send_activation (<- prev, -> next)   recv_gradient / send_gradient (<- next, -> prev)
// In the V of ZB-V and DualPipeV (ChunkLayout::V, partition.h) chunk 0 goes
// down the ranks as above and chunk 1 comes back up: the same verbs move chunk
// 1's activations to the previous rank and its gradients to the next, on links
// of their own (no wrap-around link is used). On the last rank the V turns:
// chunk 0's output is chunk 1's input, handed over in memory, and chunk 1's
// input gradient is chunk 0's output gradient - no transfer.
//
// Channels. Every link of the ring, in each direction, is its own two-rank
// process group in which one rank only sends and the other only receives
// (4 per rank: activations in and out, gradients in and out). An MPI send of
// a large message completes only once the receiver has posted its receive.
// Around a ring every stage sends at once: if each waited for its send before
// receiving, all would wait - a deadlock (Megatron avoids it with
// batch_isend_irecv, which posts all transfers at once). loom posts every send
// without waiting (MPI_Isend) and receives afterwards, so a send never blocks
// a receive; a channel's own communicator keeps its messages apart from the
// other channels' (MPI matches within a communicator), so the schedule only
// needs each channel's receives in the order of its sends.
//
// Shape and dtype travel as metadata: a tensor is preceded by a small int64
// header [ndim, dtype, dim_0, ..., dim_{ndim-1}, 0...], so a stage needs no
// fixed-shape assumption (picotron passes tensor_shapes around instead).
//
// Inside a schedule (begin_schedule() .. end_schedule(), which every schedule
// calls) the header travels once per channel, with the first transfer; later
// ones are the payload alone, received into the cached shape (ColossalAI's
// "pipeline can receive tensor shape" cache): one message per transfer
// instead of two. Every micro-batch of a step has the same shape; a send of
// another shape within a schedule is an error.
//
// Sends. Inside a schedule a send returns as soon as it is posted: the stage
// goes on computing while the transfer completes, and end_schedule() waits for
// what is still in flight (each send keeps its payload alive until then, so
// no buffer is reused early; do not write a tensor you have sent). Around the
// interleaved schedule's ring that is also what keeps large transfers from
// deadlocking: every stage sends before it receives. Outside a schedule a verb
// returns once its transfers are complete, as picotron's and Megatron's do
// (they wait on the requests of batch_isend_irecv); a combined verb posts its
// receive before it waits for its send.
//
// How a transfer is posted: sends and receives are posted and waited for on
// the caller's thread (ProcessGroup::isend / irecv, comm/mpi_p2p.cpp), and a
// send still in flight after 500 us is tested every 500 us by the channel's
// thread. Why both: Open MPI moves a message only while some thread of the
// process is inside MPI, so a send left alone between verbs stalls while the
// stage computes; and handing every transfer to the channel's thread and back
// costs a context switch or two each way. bench/README.md ("One transfer")
// has the measurements behind this choice and the designs it replaced.
// A backend that progresses sends by itself (NCCL on its stream) needs none of this.
//
// Over NCCL (train_gpt --device cuda, one GPU per rank): the channels are
// ProcessGroupByDevice groups, so the header (a host tensor) goes over MPI and
// the payload (a CUDA tensor) over NCCL. Each channel is its own communicator
// with its own stream (as torch.distributed makes one communicator per pair
// of ranks for send/recv), so a stage's send and its receive never queue
// behind each other on one stream: send_fwd_recv_bwd and the neighbour's
// send_bwd_recv_fwd meet whatever order their kernels start in, which is what
// Megatron's batch_isend_irecv (ncclGroupStart/End on one communicator)
// guarantees instead. A receive is a stream wait, not a host wait.
//
// LOOM_VERBOSE=1 prints every transfer: "[rank 1] send_forward -> stage 2 mb 3 [2, 16, 32] float32";
// with tracing on every transfer is a span on the communication track (trace/transfer_log.h).
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/comm/process_group.h"
#include "parallel/pipeline_parallel/partition.h"
#include "parallel/trace/transfer_log.h"

namespace loom::parallel {

class PipelineP2P {
 public:
  // Collective over pp_group (stage order): makes the channel groups (with
  // ChunkLayout::V also the links chunk 1 comes back up on).
  explicit PipelineP2P(ProcessGroup& pp_group, ChunkLayout layout = ChunkLayout::Interleaved);
  ~PipelineP2P();
  PipelineP2P(const PipelineP2P&) = delete;
  PipelineP2P& operator=(const PipelineP2P&) = delete;

  int pp_rank() const { return rank_; }
  int pp_size() const { return size_; }
  bool is_first_stage() const { return rank_ == 0; }
  bool is_last_stage() const { return rank_ == last_stage_rank(); }
  int last_stage_rank() const { return layout_ == ChunkLayout::V ? 0 : size_ - 1; }  // where the loss is
  ProcessGroup& pp_group() { return pp_group_; }
  // Where received activations and gradients are made: the stage's device
  // (the CPU unless the stage moved to a GPU).
  void set_device(const Device& device) { device_ = device; }

  // mb: the micro-batch the tensor belongs to (for LOOM_VERBOSE and the trace).
  Tensor recv_forward(int mb);                                   // undefined on the first stage
  void send_forward(const Tensor& output, int mb);               // no-op on the last stage
  Tensor recv_backward(int mb);                                  // undefined on the last stage
  void send_backward(const Tensor& input_grad, int mb);          // no-op on the first stage
  Tensor send_fwd_recv_bwd(const Tensor& output, int send_mb, int recv_mb);
  Tensor send_bwd_recv_fwd(const Tensor& input_grad, int send_mb, int recv_mb);

  // The ring, or the V (chunk: the model chunk the tensor belongs to; in the V also its way).
  Tensor recv_activation(int mb, int chunk);                     // <- previous rank
  void send_activation(const Tensor& output, int mb, int chunk);  // -> next rank
  Tensor recv_gradient(int mb, int chunk);                       // <- next rank
  void send_gradient(const Tensor& input_grad, int mb, int chunk);  // -> previous rank

  // One schedule's transfers: headers once per channel, and sends left in
  // flight (see above). begin_schedule() also drops what a schedule that threw
  // left behind; end_schedule() waits for the sends and forgets the cached shapes.
  void begin_schedule();
  void end_schedule();

 private:
  struct Channel;
  struct PendingSend {
    std::shared_ptr<Work> header, payload;  // header: null when the shape was cached
    TransferLog::Watch watch;               // "send_forward mb3 (64 KiB)", from the post to the delivery
  };
  // Posts the header (unless cached), then the payload (ProcessGroup::isend).
  void send(Channel& c, const Tensor& t, const char* verb, int mb, int chunk);
  // The turn of the V, on its last rank: one chunk's tensor kept for the other's (mb checks the order).
  using Handoff = std::deque<std::pair<int, Tensor>>;
  bool turns_here(int chunk_from) const { return layout_ == ChunkLayout::V && rank_ == size_ - 1 && chunk_from == 0; }
  Tensor take(Handoff& h, const char* verb, int mb);
  // The channel of a chunk's transfer: chunk 1 of a V goes the other way.
  Channel& way(int chunk, const std::unique_ptr<Channel>& down, const std::unique_ptr<Channel>& up, const char* verb) const;
  // Receives the header (unless cached), then a tensor of the shape and dtype it announces.
  Tensor recv(Channel& c, const char* verb, int mb, int chunk);
  void wait(PendingSend& s);
  void forget_shapes();
  Channel& ring(const std::unique_ptr<Channel>& c, const char* verb) const;  // c, or an error when pp is 1
  void finish_sends();  // every send, now; in a schedule only the ones already delivered

  ProcessGroup& pp_group_;
  Device device_ = kCPU;
  int rank_, size_;
  ChunkLayout layout_;
  std::unique_ptr<Channel> act_out_, act_in_, grad_out_, grad_in_;
  std::unique_ptr<Channel> act_up_out_, act_up_in_, grad_up_out_, grad_up_in_;  // the V's way back (chunk 1)
  Handoff turn_activations_, turn_gradients_;
  std::vector<PendingSend> pending_;
  bool in_schedule_ = false;
  TransferLog log_;  // LOOM_VERBOSE and the trace (trace/transfer_log.h)
};

}  // namespace loom::parallel
