// What watches a pipeline's transfers, so that pipeline_p2p.cpp holds one
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

  // One transfer: opened when it is posted, closed when it is done. chunk < 0: no chunks.
  struct Span {
    std::string name;
    double start_us = 0;
  };
  Span open(const char* verb, int mb, int chunk) const;
  void close(const Span& span, int64_t bytes) const;

  // LOOM_VERBOSE's line: "->" for a send, "<-" for a receive.
  void print(const char* verb, const char* arrow, int peer_stage, int mb, const Tensor& t) const;

 private:
  bool verbose_ = false;
};

}  // namespace loom::parallel
