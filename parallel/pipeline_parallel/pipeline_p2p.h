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
//
// Shape and dtype travel as metadata: every tensor is preceded by a small
// int64 header [ndim, dtype, dim_0, ..., dim_{ndim-1}, 0...], so a stage needs
// no fixed-shape assumption (picotron passes tensor_shapes around instead).
//
// Every verb returns once its transfers are complete, as picotron's and
// Megatron's do (they wait on the requests of batch_isend_irecv): no send is
// left in flight behind the stage's back. While the stage blocks in wait(), its
// core is idle, so the group's communication thread polls MPI flat out rather
// than napping between MPI_Tests ("waiting without hogging a core" in
// comm/process_group_mpi.cpp); the thread runs at the normal priority.
//
// Why two process groups. A ProcessGroup runs its operations one at a time, in
// order, on one thread. The MPI backend's send is an MPI_Isend that the thread
// then polls (MPI_Test) until it completes, and for large messages it completes
// only once the receiver has posted its receive; until then the thread takes
// nothing else from its queue. In 1F1B's steady state stage s does
// send_fwd_recv_bwd while stage s+1 does send_bwd_recv_fwd: on a single group
// both threads would sit polling their sends to each other and neither would
// ever post its receive - a deadlock (Megatron avoids it with
// batch_isend_irecv, which posts all four transfers at once). So activations
// travel on one copy of the pp group and gradients on another: each direction
// has its own FIFO thread, in which every send meets a receive issued in the
// same order by the peer, and a combined verb queues its send on one and its
// receive on the other before waiting for both.
//
// LOOM_VERBOSE=1 prints every transfer: "[rank 1] send_forward -> stage 2 mb 3 [2, 16, 32] float32".
// With tracing on (trace.h) every transfer is a span on the communication track.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"

namespace loom::parallel {

class PipelineP2P {
 public:
  // Collective over pp_group (stage order): makes the two direction groups.
  explicit PipelineP2P(ProcessGroup& pp_group);
  PipelineP2P(const PipelineP2P&) = delete;
  PipelineP2P& operator=(const PipelineP2P&) = delete;

  int pp_rank() const { return rank_; }
  int pp_size() const { return size_; }
  bool is_first_stage() const { return rank_ == 0; }
  bool is_last_stage() const { return rank_ == size_ - 1; }
  ProcessGroup& pp_group() { return pp_group_; }

  // mb: the micro-batch the tensor belongs to (for LOOM_VERBOSE and the trace).
  Tensor recv_forward(int mb);                                   // undefined on the first stage
  void send_forward(const Tensor& output, int mb);               // no-op on the last stage
  Tensor recv_backward(int mb);                                  // undefined on the last stage
  void send_backward(const Tensor& input_grad, int mb);          // no-op on the first stage
  Tensor send_fwd_recv_bwd(const Tensor& output, int send_mb, int recv_mb);
  Tensor send_bwd_recv_fwd(const Tensor& input_grad, int send_mb, int recv_mb);

 private:
  struct PendingSend {
    std::shared_ptr<Work> header, payload;
    std::string span;  // trace span name, "send_forward mb3"
    double start_us;
  };
  // Queues the header, then the payload, on group's thread.
  PendingSend post_send(ProcessGroup& group, int peer, const Tensor& t, const char* verb, int mb);
  void wait(PendingSend& s);
  // Receives the header, then a tensor of the shape and dtype it announces.
  Tensor recv(ProcessGroup& group, int peer, const char* verb, int mb);

  ProcessGroup& pp_group_;
  int rank_, size_;
  std::unique_ptr<ProcessGroup> fwd_group_;  // activations: stage s -> s + 1
  std::unique_ptr<ProcessGroup> bwd_group_;  // gradients:   stage s + 1 -> s
  bool verbose_ = false;
};

}  // namespace loom::parallel
