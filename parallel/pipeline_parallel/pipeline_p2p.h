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
// Each link and direction is a channel of its own (pipeline_channels.h: how a
// tensor and its shape travel, and why in a schedule no send waits for its receive).
//
// The interleaved schedule's verbs take the ring (rank p - 1's chunk c feeds
// rank 0's chunk c + 1) and always transfer:
//   recv_activation / send_activation (<- prev, -> next)   recv_gradient / send_gradient (<- next, -> prev)
// In the V of ZB-V and DualPipeV (ChunkLayout::V, partition.h) chunk 0 goes
// down the ranks as above and chunk 1 comes back up on links of its own, its
// activations to the previous rank, its gradients to the next; the last rank
// turns the V in memory (v_turn.h).
#pragma once

#include "parallel/pipeline_parallel/partition.h"
#include "parallel/pipeline_parallel/pipeline_channels.h"
#include "parallel/pipeline_parallel/v_turn.h"

namespace loom::parallel {

class PipelineP2P {
 public:
  // Collective over pp_group (stage order): opens the channels (with
  // ChunkLayout::V also the links chunk 1 comes back up on).
  explicit PipelineP2P(ProcessGroup& pp_group, ChunkLayout layout = ChunkLayout::Interleaved);

  int pp_rank() const { return rank_; }
  int pp_size() const { return size_; }
  bool is_first_stage() const { return rank_ == 0; }
  bool is_last_stage() const { return rank_ == last_stage_rank(); }
  int last_stage_rank() const { return layout_ == ChunkLayout::V ? 0 : size_ - 1; }  // where the loss is
  ProcessGroup& pp_group() { return pp_group_; }
  // Where received activations and gradients are made: the stage's device.
  void set_device(const Device& device) { channels_.set_device(device); }

  // mb: the micro-batch the tensor belongs to (for LOOM_VERBOSE and the trace).
  Tensor recv_forward(int mb) { return is_first_stage() ? Tensor() : channels_.recv(*act_in_, "recv_forward", mb, -1); }
  void send_forward(const Tensor& output, int mb) { sent(post_forward(output, mb, false)); }
  Tensor recv_backward(int mb) { return is_last_stage() ? Tensor() : channels_.recv(*grad_in_, "recv_backward", mb, -1); }
  void send_backward(const Tensor& input_grad, int mb) { sent(post_backward(input_grad, mb, false)); }
  Tensor send_fwd_recv_bwd(const Tensor& output, int send_mb, int recv_mb);
  Tensor send_bwd_recv_fwd(const Tensor& input_grad, int send_mb, int recv_mb);

  // The ring, or the V (chunk: the model chunk the tensor belongs to; in the V also its way).
  Tensor recv_activation(int mb, int chunk);  // <- previous rank
  void send_activation(const Tensor& output, int mb, int chunk) { sent(post_activation(output, mb, chunk, false)); }
  Tensor recv_gradient(int mb, int chunk);  // <- next rank
  void send_gradient(const Tensor& input_grad, int mb, int chunk) { sent(post_gradient(input_grad, mb, chunk, false)); }

  // The sends alone. A table schedule's (schedule_table.h) are held, each until the schedule
  // waits for it at a point of its order (send_release.h), not whenever a later send finds it
  // delivered. Each returns the ticket for wait_send; 0 where nothing is sent (the V's turn,
  // post_forward on the last stage, post_backward on the first).
  uint64_t post_forward(const Tensor& output, int mb, bool hold = true) {
    return is_last_stage() ? 0 : channels_.post(*act_out_, output, "send_forward", mb, -1, hold);
  }
  uint64_t post_backward(const Tensor& input_grad, int mb, bool hold = true) {
    return is_first_stage() ? 0 : channels_.post(*grad_out_, input_grad, "send_backward", mb, -1, hold);
  }
  uint64_t post_activation(const Tensor& output, int mb, int chunk, bool hold = true);
  uint64_t post_gradient(const Tensor& input_grad, int mb, int chunk, bool hold = true);
  void wait_send(uint64_t ticket) {
    if (ticket) channels_.wait_send(ticket);
  }

  // A schedule's transfers (every schedule calls both): sends return once posted,
  // end_schedule() waits for them (pipeline_channels.h).
  void begin_schedule() {
    turn_activations_.clear();
    turn_gradients_.clear();
    channels_.begin_schedule();
  }
  void end_schedule() { channels_.end_schedule(); }

 private:
  void sent(uint64_t /*ticket*/) { channels_.finish_sends(); }  // a send verb returns once sent (in a schedule: posted)
  bool turns_here(int chunk_from) const { return layout_ == ChunkLayout::V && rank_ == size_ - 1 && chunk_from == 0; }
  // The channel of a ring or V transfer (chunk 1 of a V goes the other way); an error when pp is 1.
  Channel& way(int chunk, Channel* down, Channel* up, const char* verb) const;

  ProcessGroup& pp_group_;
  int rank_, size_;
  ChunkLayout layout_;
  PipelineChannels channels_;
  Channel *act_out_ = nullptr, *act_in_ = nullptr, *grad_out_ = nullptr, *grad_in_ = nullptr;
  Channel *act_up_out_ = nullptr, *act_up_in_ = nullptr, *grad_up_out_ = nullptr, *grad_up_in_ = nullptr;  // the V's way back
  VTurn turn_activations_, turn_gradients_;  // on the V's last rank: chunk 0 -> chunk 1, and back
};

}  // namespace loom::parallel
