// Communication of a planned run: what each group sends per step, and how
// long it takes over the link that group lies on.
//
// Ring collectives over n ranks, payload S bytes (the tensor's size), link
// bandwidth B per direction and per-message latency alpha (Patarasuk & Yuan
// 2009; NCCL's "bus bandwidth" convention):
//   all-reduce       2 (n - 1) alpha + 2 (n - 1) / n x S / B
//   all-gather       (n - 1) alpha + (n - 1) / n x S / B      S = the gathered tensor
//   reduce-scatter   (n - 1) alpha + (n - 1) / n x S / B      S = the input tensor
//   send / recv      alpha + S / B
// Which link: ranks are laid out tp fastest, then cp, dp, pp
// (parallel/process_group_manager.h), nodes fill in rank order, so a group
// stays inside a node (NVLink) when the ranks it spans fit in one:
//   tp: tp <= G   cp: tp cp <= G   dp: tp cp dp <= G   pp and the embedding group: the world <= G
// with G devices per node; otherwise it crosses InfiniBand.
//
// What each group carries (per rank):
//   tp   per layer per micro-batch, 2 all-reduces of [b, s, h] forward and 2
//        backward (Megatron's f and g; with sequence parallelism 2 all-gathers
//        + 2 reduce-scatters each way: the same bytes); recomputation adds the
//        forward's 2 again. Around the layers: the embedding's all-reduce
//        (forward), the head's (backward), cross-entropy's 3 of [b, s] fp32.
//   pp   per micro-batch and chunk, the activation [b, s, h] forward and its
//        gradient backward (/ tp with sequence parallelism: each tp rank sends
//        its slice).
//   dp   per step, the fp32 gradient buffer: all-reduce; under ZeRO a
//        reduce-scatter of it and an all-gather of the updated params. With
//        cp the group is dp x cp (every cp rank's gradient is a partial sum).
//   cp   ring attention's K/V hops: plan/cp_model.h.
// With cp every [b, s, h] above is [b, s / cp, h]: a rank holds s / cp tokens.
//   embedding group (pp > 1): the tied wte's gradient, all-reduced between
//        the first and the last stage, V' h / tp fp32.
#pragma once

#include <string>
#include <vector>

#include "plan/config.h"
#include "plan/machine.h"

namespace loom::plan {

struct Link {
  double bytes_per_s = 0, latency_s = 0;
  bool inter_node = false;
};

// The link a group spanning `span` consecutive ranks (its size x its stride) uses.
Link link_for_span(const Machine& mc, int64_t span);

double all_reduce_seconds(double bytes, int n, const Link& l);
double all_gather_seconds(double bytes, int n, const Link& l);  // also reduce-scatter
double send_seconds(double bytes, const Link& l);

// One group's traffic in one step on one rank.
struct GroupTraffic {
  std::string group;      // "tp", "pp", "dp", "embedding"
  std::string what;       // which collective, on what
  double ops = 0;         // collectives (or sends) per step
  double payload = 0;     // bytes of the tensors, summed over ops
  double wire = 0;        // bytes this rank sends: payload x the ring factor
  double seconds = 0;     // time if nothing overlapped it
  bool inter_node = false;
};

// Per micro-batch on pipeline rank `stage` (on the critical path: the next
// layer waits for it), and per step (after the pipeline).
GroupTraffic tp_per_micro_batch(const ModelShape& m, const Grid& g, const Batch& b, const Machine& mc, int stage);
GroupTraffic pp_per_micro_batch(const ModelShape& m, const Grid& g, const Batch& b, const Machine& mc, int stage);
GroupTraffic dp_per_step(int64_t params_on_rank, const Grid& g, const Machine& mc);
GroupTraffic embedding_per_step(const ModelShape& m, const Grid& g, const Machine& mc);

}  // namespace loom::plan
