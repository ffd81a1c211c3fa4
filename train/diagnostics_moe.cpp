// --memory-report's activation formula for a mixture of experts, from the routing's counts (nn/moe.h's
// RoutingStats::loads, one [E] per forward): the rows each micro-batch kept (a capacity) and sent to this
// rank's experts (--ep), each expert's rows in its last block (the experts' backward is walked expert by
// expert, dropless too), and the micro-batch among them whose rows cost most (optim/moe_activations.h).
#include <algorithm>

#include "train/diagnostics.h"

namespace loom::train {

double Diagnostics::costliest_micro_batch(const optim::ActivationCase& c) const {
  const std::vector<nn::MoE*> moe = nn::moe_layers(*m_.chunks);
  const bool routed_rows = pgm_.ep_size > 1 || c_.cfg.moe.capacity_factor > 0;
  // Full recomputation with a capacity or --ep: each block's rerun rebuilds it with its own rows (kept; received).
  const bool rerun_rows = routed_rows && c.recompute == parallel::Recompute::Full;
  // Dropless too, each micro-batch's experts' backward is walked with its own groups (moe_activations.h's (X)).
  if (moe.empty() || moe.back()->stats.loads.size() != size_t(c.micro_batches) ||
      (c.micro_batches == 1 && !rerun_rows))
    return optim::predict_activations(c).total;
  // A pipeline stage holds several micro-batches at once, each with its own rows (reading one micro-batch's
  // for all in flight was 0.2% over on stage 0 under --ep 2 --pp 2, a capacity more).
  if (pgm_.pp_size > 1 && !rerun_rows) return pipeline_rows_walk(moe, c);
  // --ep or a capacity with --grad-accum: each micro-batch routes its own rows (to this rank's experts; kept
  // by the capacity), so the peak is that of the micro-batch whose rows cost most (the first one without the
  // later ones' .grad tensors).
  double most = 0;
  for (size_t j = 0; j < moe.back()->stats.loads.size(); ++j) {
    optim::ActivationCase one = c;
    micro_batch_routing(moe, one, j);
    if (j == 0) one.micro_batches = 1;
    // A pipeline stage (1F1B, AFAB): micro-batch j's backward with j..j+k-1 in flight (k = c.in_flight).
    if (pgm_.pp_size > 1) one.in_flight = std::min(c.in_flight, double(c.micro_batches) - double(j));
    most = std::max(most, rerun_rows ? costliest_rerun(moe, one, j) : optim::predict_activations(one).total);
  }
  return most;
}

// A capacity or --ep under --recompute full: block l's rerun (its (U), its backward) holds its own rows -
// kept by the capacity, received by this rank's experts - with the blocks past it done - their inputs let
// go, their .grad tensors (if any) alive - and the earlier ones' inputs kept: the formula's last block of
// l + 1 blocks (rerun_blocks_after past it). Its forward is the same count, the head's moments less than
// the whole stage's: the costliest block's is the peak (under ep not always the last: its experts may have
// received fewer rows). On a pipeline stage without the head that count leaves out the output gradient the
// stage received (held until the micro-batch's backward returns) and, in each other micro-batch in flight,
// the inputs of the blocks past l: ((k - 1) past + 1) [b, s, h] (measured at dp 2 ep 2 pp 2, two to four
// blocks a stage, and with a capacity).
double Diagnostics::costliest_rerun(const std::vector<nn::MoE*>& moe, const optim::ActivationCase& c,
                                    size_t micro_batch) const {
  double most = 0;
  for (size_t l = 0; l < moe.size(); ++l) {
    optim::ActivationCase at = rerun_case(moe, l, c, micro_batch);
    at.blocks = c.blocks - at.rerun_blocks_after;
    if (at.zero3.on && l + 1 < moe.size()) {  // ZeRO-3: beside the next block's reduce-scatter, l - 1 prefetched
      at.zero3.head_reduce = c.zero3.block_reduce, at.zero3.last_block = c.zero3.earlier_block;
      at.zero3.before_last = l == 0 ? c.zero3.first : c.zero3.earlier_block;
      // without reshard after forward: the embedding's and the blocks' before l - 1, gathered since their forward
      const double before = l == 0 ? 0 : c.zero3.first + double(l - 1) * c.zero3.earlier_block;
      at.zero3.resident = c.zero3.reshard_after_forward ? 0 : before;
    }
    at.zero3.block_reduce = 0;  // this walk is the earlier blocks' count
    const double input = double(c.micro_batch * c.seq) / (c.sequence_parallel ? c.tp : 1) * double(c.width) *
                         double(c.element_bytes);  // [b, s, h], sharded under SP
    const double past = double(at.rerun_blocks_after), others = at.in_flight - 1;
    const double held = c.pp_stage && !c.has_head && past > 0 ? (others * past + 1) * input : 0;
    most = std::max(most, optim::predict_activations(at).total + held);
  }
  return most;
}

// Block l of `moe` (a stage's, or a chunk's) rerun with micro-batch j's rows - kept by a capacity, received by
// this rank's experts under --ep - as the last block, those past it done (rerun_blocks_after; the caller sets
// blocks).
optim::ActivationCase Diagnostics::rerun_case(const std::vector<nn::MoE*>& moe, size_t l,
                                              const optim::ActivationCase& c, size_t j) const {
  optim::ActivationCase at = c;
  const std::vector<int64_t>& kept = moe[l]->stats.loads.at(j);  // [E] rows block l kept
  at.rerun_blocks_after = int64_t(moe.size() - 1 - l);
  at.moe_last_rows = 0;
  for (int64_t g : kept) at.moe_last_rows += double(g);
  at.moe_largest_group = *std::max_element(kept.begin(), kept.end());
  at.moe_local_groups = pgm_.ep_size > 1 ? local_groups(*moe[l], j) : kept;
  return at;
}

// A pipeline stage (1F1B, AFAB): the micro-batches in flight each keep their own rows (kept by a capacity;
// received by this rank's experts under --ep; dropless, each its own groups at its backward), so this adds
// up those in flight at each forward's (U) and each backward's moments (in_flight x one's kept, where every
// micro-batch routes alike). Under ZeRO-3 each moment
// counts the stage's units too (zero3_activations.h), which every micro-batch gathers alike. 1F1B runs F_q
// after B_{q-k} with the k - 1 before it in flight (k = c.in_flight) and B_i with i..i+k-1 in flight; AFAB
// every forward first (k = m). The first backward, and the forwards before it, see no earlier micro-batch's
// .grad tensors nor a sent gradient (predict_activations' first clause).
double Diagnostics::pipeline_rows_walk(const std::vector<nn::MoE*>& moe, const optim::ActivationCase& c) const {
  const size_t m = size_t(c.micro_batches), k = size_t(c.in_flight);
  std::vector<optim::ActivationPrediction> first, later;  // [micro-batch]: alone, and after B_0
  for (size_t j = 0; j < m; ++j) {
    optim::ActivationCase one = c;
    micro_batch_routing(moe, one, j);
    one.in_flight = 1, one.micro_batches = 1;
    first.push_back(optim::predict_activations(one));
    one.micro_batches = 2;
    later.push_back(optim::predict_activations(one));
  }
  auto kept = [&](size_t from, size_t to) {  // what micro-batches [from, to) keep
    double bytes = 0;
    for (size_t r = from; r < std::min(to, m); ++r) bytes += first[r].per_micro_batch;
    return bytes;
  };
  double most = 0;
  for (size_t q = 0; q < m; ++q)
    most = std::max(most, kept(q + 1 >= k ? q + 1 - k : 0, q + 1) + (q >= k ? later : first)[q].forward_extra);
  for (size_t i = 0; i < m; ++i) most = std::max(most, kept(i, i + k) + (i == 0 ? first : later)[i].backward_moments);
  return most + first.front().tokens;
}

// An interleaved or zero-bubble pipeline: [chunk][micro-batch] c with the rows that micro-batch kept (a
// capacity; sent this rank's experts, --ep) and its groups in the chunk's own MoE blocks, for
// predict_activations_interleaved's walk, where each micro-batch keeps its own from its forward to its
// backward (reading the rank's last micro-batch's for all put stage 0 of --dp 2 --ep 2 --pp 2
// --virtual-stages 2 0.25% off either way) and walks its own experts' backward. Empty: no experts.
std::vector<std::vector<optim::RoutedRows>> Diagnostics::chunk_rows(const optim::ActivationCase& c) const {
  const std::vector<nn::MoE*> all = nn::moe_layers(*m_.chunks);
  // Dropless too: each backward walks its last block's experts with that micro-batch's groups.
  if (all.empty() || all.back()->stats.loads.size() != size_t(c.micro_batches)) return {};
  // Full recomputation with a capacity or --ep: each block's rerun with its own rows (costliest_rerun's).
  const bool rerun_rows =
      (pgm_.ep_size > 1 || c_.cfg.moe.capacity_factor > 0) && c.recompute == parallel::Recompute::Full;
  std::vector<std::vector<optim::RoutedRows>> rows;
  size_t layer = 0;
  for (const parallel::LayerRange& r : m_.chunks->chunks()) {
    std::vector<nn::MoE*> moe;  // the chunk's, in order
    for (int64_t i = r.start; i < r.end; ++i, ++layer)
      for (nn::MoE* l : nn::moe_layers(*m_.chunks->layers()[layer])) moe.push_back(l);
    rows.emplace_back(size_t(c.micro_batches), optim::RoutedRows{c, {}});
    for (size_t j = 0; j < rows.back().size() && !moe.empty(); ++j) {
      micro_batch_routing(moe, rows.back()[j].rows, j);
      for (size_t l = 0; rerun_rows && l < moe.size(); ++l)
        rows.back()[j].reruns.push_back(rerun_case(moe, l, rows.back()[j].rows, j));
    }
  }
  return rows;
}

// The rows micro-batch j of the step routed: with a capacity, those each block kept of this rank's slots
// (their mean over the blocks and the last block's); under ep, those its experts received; and the last
// block's groups, each of this rank's experts' rows (dropless too: the (X) walk's).
void Diagnostics::micro_batch_routing(const std::vector<nn::MoE*>& moe, optim::ActivationCase& c, size_t j) const {
  if (c_.cfg.moe.capacity_factor > 0) {
    c.moe_kept_rows = 0;
    for (nn::MoE* layer : moe) {
      c.moe_last_rows = 0;
      for (int64_t g : layer->stats.loads.at(j)) c.moe_last_rows += double(g);
      c.moe_kept_rows += c.moe_last_rows / double(moe.size());
    }
  }
  if (pgm_.ep_size > 1) received_rows(moe, c, j);
  else c.moe_local_groups = moe.back()->stats.loads.at(j);  // the last block's groups: every expert is this rank's
}


// Expert parallelism: the rows each of this rank's experts computed in micro-batch j of the step, from
// every rank of its ep group (collective over ep): per block R, averaged over the blocks (what they
// keep), and the last block's per expert (its backward runs first).
void Diagnostics::received_rows(const std::vector<nn::MoE*>& moe, optim::ActivationCase& c, size_t j) const {
  c.moe_ep = pgm_.ep_size;
  double rows = 0;
  for (nn::MoE* layer : moe) {
    c.moe_local_groups = local_groups(*layer, j);
    for (int64_t g : c.moe_local_groups) rows += double(g);
  }
  c.moe_received_rows = rows / double(moe.size());
}

// [E / ep]: the rows each of this rank's experts of `layer` got in micro-batch j, from the whole ep group
// (collective over ep).
std::vector<int64_t> Diagnostics::local_groups(nn::MoE& layer, size_t j) const {
  Tensor load = from_vector(layer.stats.loads.at(j));  // [E] rows this rank sent to each expert
  pgm_.ep_group().all_reduce(load, parallel::ReduceOp::Sum);
  const std::vector<int64_t> all = load.to_vector<int64_t>();
  const auto first = all.begin() + layer.experts->first();
  return {first, first + int64_t(layer.experts->size())};
}

}  // namespace loom::train
