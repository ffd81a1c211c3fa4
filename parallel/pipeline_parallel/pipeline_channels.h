// PipelineChannels: how pipeline_p2p.h's verbs move a tensor between two
// stages. Every link of the pipeline, in each direction, is its own two-rank
// process group (a channel) in which one rank only sends and the other only
// receives. An MPI send of a large message completes only once the receiver
// has posted its receive; around a ring every stage sends at once, and if each
// waited for its send before receiving, all would wait - a deadlock (Megatron
// avoids it with batch_isend_irecv, which posts all transfers at once). Here
// every send is posted without waiting (MPI_Isend) and receives come after, so
// a send never blocks a receive; a channel's own communicator keeps its
// messages apart (MPI matches within a communicator), so a schedule only needs
// each channel's receives in the order of its sends.
//
// Shape and dtype travel as a small int64 header [ndim, dtype, dim_0, ..., 0...]
// before the payload (picotron passes tensor_shapes around instead). Inside a
// schedule (begin_schedule() .. end_schedule()) the header travels once per
// channel and later payloads are received into the cached shape (ColossalAI's
// shape cache): one message per transfer. A send of another shape within a
// schedule is an error.
//
// Sends. Inside a schedule a send returns once posted: the stage computes while
// it completes, end_schedule() waits for what is still in flight (each send
// keeps its payload alive until then: do not write a tensor you have sent).
// Outside a schedule a verb returns once its transfers are complete, as
// picotron's and Megatron's do. Sends and receives are posted and waited for on
// the caller's thread (ProcessGroup::isend / irecv, comm/mpi_p2p.cpp), and a
// send still in flight after 500 us is tested every 500 us by the channel's
// thread: Open MPI moves a message only while some thread is inside MPI, and a
// hand-off to another thread costs a context switch or two each way
// (bench/README.md, "One transfer", has the measurements and the designs this replaced).
//
// Over NCCL (one GPU per rank) the channels are ProcessGroupByDevice groups:
// the header (a host tensor) goes over MPI, the payload over NCCL, each
// channel on its own communicator and stream (as torch.distributed makes one
// per pair of ranks), so a stage's send and receive never queue behind each
// other: they meet the neighbour's whatever order their kernels start in,
// which Megatron's batch_isend_irecv guarantees instead. A receive is a stream
// wait, not a host wait.
//
// LOOM_VERBOSE=1 prints every transfer and --trace draws it (trace/transfer_log.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"
#include "parallel/trace/transfer_log.h"

namespace loom::parallel {

// One direction of one link: `stage` is the pp rank at the other end.
struct Channel {
  std::unique_ptr<ProcessGroup> group;  // two ranks: the sender is group rank 0
  int stage = 0;
  bool cached = false;  // in a schedule, once the header has gone by
  Shape shape;
  DType dtype = kFloat32;
};

class PipelineChannels {
 public:
  explicit PipelineChannels(int pp_rank) : rank_(pp_rank) {}
  // Collective over pp_group: the channel from -> to, or null on a rank that is neither.
  Channel* open(ProcessGroup& pp_group, int from, int to, const std::string& name);
  // Where received tensors are made: the stage's device.
  void set_device(const Device& device) { device_ = device; }

  // Posts the header (unless cached), then the payload; finish_sends() waits for
  // them. Returns the send's ticket for wait_send(). hold: the send keeps its
  // payload and header alive until wait_send() or end_schedule(), however soon
  // it completes, and finish_sends() leaves it (a table schedule's sends:
  // send_release.h); else it lets go of them once MPI is done.
  uint64_t post(Channel& c, const Tensor& t, const char* verb, int mb, int chunk, bool hold = false);
  // post(), then finish_sends().
  void send(Channel& c, const Tensor& t, const char* verb, int mb, int chunk) {
    post(c, t, verb, mb, chunk);
    finish_sends();
  }
  // Receives the header (unless cached), then a tensor of the shape and dtype it announces.
  Tensor recv(Channel& c, const char* verb, int mb, int chunk);
  // Every send, now; in a schedule only the ones already delivered (but held ones).
  void finish_sends();
  // Waits for one send and lets go of it (nothing if already let go).
  void wait_send(uint64_t ticket);
  // begin_schedule() also drops what a schedule that threw left behind;
  // end_schedule() waits for the sends and forgets the cached shapes.
  void begin_schedule();
  void end_schedule();

 private:
  struct PendingSend {
    std::shared_ptr<Work> header, payload;  // header: null when the shape was cached
    TransferLog::Watch watch;               // "send_forward mb3 (64 KiB)", from the post to the delivery
    uint64_t ticket = 0;
    Tensor held_payload, held_header;       // hold: alive until wait_send (MPI lets go of its own at completion)
  };
  void wait(PendingSend& s);
  void forget_shapes();

  int rank_;  // this stage's pp rank
  std::vector<std::unique_ptr<Channel>> channels_;
  Device device_ = kCPU;
  std::vector<PendingSend> pending_;
  uint64_t tickets_ = 0;
  bool in_schedule_ = false;
  TransferLog log_;  // LOOM_VERBOSE and the trace
};

}  // namespace loom::parallel
