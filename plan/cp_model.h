// Context parallelism in the plan: what ring attention sends per layer, and
// whether the ring hides it behind the attention math (the overlap condition).
//
// One K/V block: the keys and values of a rank's s / cp tokens, on one tp rank
//   K = 2 b (s / cp) kv / tp elements            (kv = kv heads x head dim: h, or GQA's smaller)
// Per layer and micro-batch, a rank sends (parallel/context_parallel/ring_attention.h)
//   forward    cp - 1 hops of K/V                 in the model's dtype
//   backward   cp - 1 hops of K/V, cp of dK/dV    dK/dV in fp32 (the ring's math)
//   recompute  (full or selective) the forward ring once more inside backward
// so (3 cp - 2) K x 4 bytes at fp32 without recomputation: about three times
// the whole sequence's K and V, whatever cp (bench_ring_attention counts it).
//
// Overlap: each ring step computes two (s / 2cp)² blocks of every query chunk
// (the zig-zag split gives every rank the same causal half), 8 b c² h / tp
// FLOPs forward with c = s / 2cp tokens a chunk, while the next block travels.
// A hop hides behind its step when
//   hop = latency + 4 b c kv d / tp / bandwidth  <=  8 b c² h / tp / flops    (d bytes an element)
//   i.e. (latency aside)   c  >=  c* = d kv flops / (2 h bandwidth)
// Backward computes twice the forward per step while K/V (d) and dK/dV (4)
// travel; its dK/dV hop home after the last step has nothing to hide behind.
// What is not hidden is on the critical path: exposed = the sum of
// max(0, hop - step) over the steps, + the last dK/dV hop.
#pragma once

#include "plan/comm_model.h"

namespace loom::plan {

// Ring attention's traffic for one micro-batch on pipeline rank `stage`
// (every block it holds); seconds: every hop's, as if none were hidden.
GroupTraffic cp_per_micro_batch(const ModelShape& m, const Grid& g, const Batch& b, const Machine& mc, int stage);

// The part of it not hidden behind the blocks' math: blocks x RingOverlap::exposed_s.
double cp_exposed_per_micro_batch(const ModelShape& m, const Grid& g, const Batch& b, const Machine& mc, int stage);

// One layer's ring, step by step: the overlap condition's two sides.
struct RingOverlap {
  double chunk_tokens = 0;      // c = s / 2cp
  double min_chunk_tokens = 0;  // c*: the chunk from which a hop hides (latency aside)
  double hop_fwd_s = 0, step_fwd_s = 0;  // one K/V hop; one step's block math, forward
  double hop_bwd_s = 0, step_bwd_s = 0;  // K/V + dK/dV; twice the forward's math
  double exposed_s = 0;         // one layer, one micro-batch: forward + backward (+ recomputation)
  bool hidden() const { return hop_fwd_s <= step_fwd_s && hop_bwd_s <= step_bwd_s; }
};
RingOverlap ring_overlap(const ModelShape& m, const Grid& g, const Batch& b, const Machine& mc);

// Elements of one K/V block on one rank: 2 b (s / cp) kv / tp.
double kv_block_elements(const ModelShape& m, const Grid& g, const Batch& b);

}  // namespace loom::plan
