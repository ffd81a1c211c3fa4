// The start-up handshake: before its first collective, every rank says what it
// is about to run, and a rank that disagrees stops the job with a message
// instead of corrupting memory or hanging. Two ranks started with different
// --layers would wait forever in an all-reduce of different sizes; with
// different corpora (different vocabularies) their broadcasts would overrun
// each other's buffers. Collectives trust that every rank passes the same
// sizes (MPI and NCCL do not check), so the check belongs before them.
//
//   check_ranks_agree(world(), {{"layers", "4"}, {"dtype", "bf16"}, {"corpus hash", "9f3a..."}});
//   -> on every rank: "ranks disagree on the run config: layers: '4' on ranks 0, 2; '3' on rank 1
//                       hosts: ranks 0, 1 on node-a; rank 2 on node-b"
// (the last line, each rank's hostname, says which machine to fix).
//
// Collective over `group`; every rank throws the same loom::Error, so the job
// ends through the usual error path on every rank at once (no rank is left
// waiting in a later collective).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "parallel/comm/process_group.h"

namespace loom::parallel {

using RunFields = std::vector<std::pair<std::string, std::string>>;  // (name, value), in a fixed order

// Gathers every rank's fields and compares them; throws naming each field that
// differs, its values and the ranks holding each. `what` names the fields in
// the message ("run config", "data"); `hint` says what a difference means or
// what to do about it (the build, a teach-break that caused it).
void check_ranks_agree(ProcessGroup& group, const RunFields& fields, const std::string& what = "run config",
                       const std::string& hint = "every rank must be started with the same flags and data");

// Every rank's string, in rank order (lengths, then the padded bytes, by two
// all_gathers). Collective over group.
std::vector<std::string> all_gather_strings(ProcessGroup& group, const std::string& mine);

// A 64-bit FNV-1a hash, fed in pieces, as 16 hex digits: a cheap fingerprint
// of a corpus for the handshake, and of checkpoint pieces for their manifest
// (equal bytes, equal hash; a difference shows).
struct Fingerprint {
  uint64_t h = 0xcbf29ce484222325ull;  // the offset basis
  void add(const void* data, size_t bytes);
  std::string hex() const;
};
std::string fingerprint(const void* data, size_t bytes);  // of one buffer

}  // namespace loom::parallel
