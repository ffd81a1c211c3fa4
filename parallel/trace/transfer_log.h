// What watches a pipeline's transfers, so that pipeline_channels.cpp holds one
// line of it per send and receive: with LOOM_VERBOSE=1 a line per transfer
//   [rank 1] recv_forward <- stage 0 mb 3 [2, 16, 32] float32
// and, with tracing on (trace.h), a span on the communication track from the
// moment the transfer was posted to the moment it was done, with the payload's
// size as the collectives' spans give theirs: "send_forward mb3 (64 KiB)", with
// chunks "send_activation mb3.1 (64 KiB)" (Megatron's virtual micro-batch).
#pragma once

#include <string>

#include "tensor/tensor.h"

namespace loom::parallel {

class TransferLog {
 public:
  TransferLog();  // reads LOOM_VERBOSE

  // One transfer's trace span, from when it is posted to when it is done:
  // done(), or the Watch's end.
  class Watch {
   public:
    Watch() = default;
    Watch(std::string name, int64_t bytes);  // starts now
    Watch(Watch&& o) noexcept { *this = std::move(o); }
    Watch& operator=(Watch&& o) noexcept;
    ~Watch() { done(); }
    void done();
    int64_t bytes = 0;

   private:
    std::string name_;
    double start_us_ = -1;
  };
  // A send of payload to peer_stage, posted (chunk < 0: no chunks): its
  // LOOM_VERBOSE line, and its span until the send is done.
  Watch sent(const char* verb, int peer_stage, int mb, int chunk, const Tensor& payload) const;
  // A receive, posted; received() prints its line once t is in and ends the span.
  Watch receiving(const char* verb, int mb, int chunk) const;
  void received(Watch& w, const char* verb, int peer_stage, int mb, const Tensor& t) const;

 private:
  // LOOM_VERBOSE's line: "->" for a send, "<-" for a receive.
  void print(const char* verb, const char* arrow, int peer_stage, int mb, const Tensor& t) const;
  bool verbose_ = false;
};

}  // namespace loom::parallel
