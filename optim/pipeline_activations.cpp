// A pipeline rank's activation peak, walked through its own schedule (pipeline_activations.h's
// predict_activations_interleaved): interleaved 1F1B, ZB-H1 and the V's, each chunk's micro-batches
// counted by predict_activations and added up op by op.
#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <string>

#include "optim/pipeline_activations.h"
#include "parallel/pipeline_parallel/dualpipev_schedule.h"
#include "parallel/pipeline_parallel/interleaved_schedule.h"
#include "parallel/pipeline_parallel/send_release.h"
#include "parallel/pipeline_parallel/zbv_schedule.h"
#include "parallel/pipeline_parallel/zero_bubble_schedule.h"

namespace loom::optim {

std::vector<parallel::ScheduledOp> chunk_order(const std::string& schedule, int pp, int stage, int virtual_stages,
                                               int64_t micro_batches) {
  if (schedule == "zb-v") return parallel::zb_v_order(pp, stage, int(micro_batches));
  if (schedule == "dualpipev") return parallel::dualpipev_order(pp, stage, int(micro_batches));
  if (schedule == "zb-h1") return parallel::zb_h1_order(pp, stage, int(micro_batches));
  return parallel::interleaved_order(pp, stage, virtual_stages, int(micro_batches));
}

double micro_batches_in_flight(const char* schedule, int64_t micro_batches, int pp, int stage, int virtual_stages) {
  const double m = double(micro_batches);
  if (pp <= 1) return 1;  // gradient accumulation: one micro-batch at a time
  if (std::string(schedule) == "afab") return m;
  // ZB-H1 (zero_bubble_schedule.h): up to p on every stage, from F to W (W keeps X and dY).
  if (std::string(schedule) == "zb-h1") return std::min(m, double(pp));
  if (virtual_stages <= 1) return std::min(m, double(pp - stage));
  // ZB-V and DualPipeV (zbv_schedule.h, dualpipev_schedule.h): the most
  // chunk-micro-batches held at once, from F to W, over the 2 chunks.
  if (parallel::schedule_chunk_layout(schedule) == parallel::ChunkLayout::V) {
    int now = 0, most = 0;
    for (const parallel::ScheduledOp& op : chunk_order(schedule, pp, stage, virtual_stages, micro_batches)) {
      if (op.kind == 'F') most = std::max(most, ++now);
      if (op.kind == 'W') --now;
    }
    return double(most) / virtual_stages;
  }
  // Interleaved: the forwards of single chunks before the first backward (the
  // schedule's own order, interleaved_schedule.h: its warm-up and one more).
  const std::vector<parallel::ScheduledOp> order =
      parallel::interleaved_order(pp, stage, virtual_stages, int(micro_batches));
  const auto first_backward = std::find_if(order.begin(), order.end(), [](const auto& op) { return op.kind == 'B'; });
  return double(first_backward - order.begin()) / virtual_stages;
}

ActivationPrediction predict_activations_interleaved(const ActivationCase& c, const std::vector<ChunkActivations>& chunks,
                                                     int pp, int stage, const std::string& schedule,
                                                     const std::vector<std::vector<RoutedRows>>* routed) {
  // Each chunk as a stage of its own: its bytes per micro-batch, and its
  // backward's temporaries the first time and later (with its own .grad
  // tensors alive). Not a pipeline stage: the gradient in flight is counted below.
  // [chunk][micro-batch] (one micro-batch stands for all unless routed gives each its own rows).
  std::vector<std::vector<ActivationPrediction>> first(chunks.size()), later(chunks.size());
  // ZeRO-3: with an earlier backward's reduce-scatter still in flight (pending_reduce, zero3_activations.h).
  // rerun: under --recompute full with routed rows, that block's rerun (its blocks: the chunk's less those past it).
  auto alone = [&](size_t k, size_t mb, int64_t micro_batches, bool pp_stage, double pending_reduce = 0,
                   const ActivationCase* rerun = nullptr) {
    ActivationCase one = rerun ? *rerun : routed ? (*routed)[k][mb].rows : c;
    one.blocks = chunks[k].blocks - (rerun ? rerun->rerun_blocks_after : 0);
    one.has_head = chunks[k].has_head, one.has_embedding = chunks[k].has_embedding;
    one.grad_bytes = chunks[k].grad_bytes;
    if (chunks[k].zero3.on) one.zero3 = chunks[k].zero3, one.zero3.pending_reduce = pending_reduce;
    // ZeRO-3: block l's rerun (l before the chunk's last) runs beside the next block's reduce-scatter with its
    // own units and l - 1's (prefetched; the chunk's embedding before its first block) gathered, as
    // costliest_rerun maps a stage's; the walk over the blocks replaces predict_activations' own count of the
    // block before the last.
    if (rerun && one.zero3.on) {
      const Zero3Held& z = chunks[k].zero3;
      if (rerun->rerun_blocks_after > 0)
        one.zero3.head_reduce = z.block_reduce, one.zero3.last_block = z.earlier_block,
        one.zero3.before_last = one.blocks == 1 ? z.first : z.earlier_block;
      one.zero3.block_reduce = 0;
    }
    one.in_flight = 1, one.micro_batches = micro_batches, one.pp_stage = pp_stage;
    return predict_activations(one);
  };
  for (size_t k = 0; k < chunks.size(); ++k)
    for (size_t mb = 0; mb < (routed ? size_t(c.micro_batches) : 1); ++mb) {
      first[k].push_back(alone(k, mb, 1, false));
      // held until W: the chunk's input and its gradient (all but the first virtual stage)
      first[k].back().held_until_w = alone(k, mb, 1, true).held_until_w;
      later[k].push_back(alone(k, mb, 2, false));
    }
  // The input gradient an earlier backward sent (any chunk but the first
  // virtual stage's): an isend that may still be in flight, [b s h] (/ t under SP).
  const double sent = double(c.micro_batch * c.seq) / (c.sequence_parallel ? c.tp : 1) * double(c.width) *
                      double(c.element_bytes);
  // A backward's temporaries above all that is kept ((U) is its forward's candidate, not its backward's).
  auto own = [](const ActivationPrediction& b) {
    return b.backward_extra == b.forward_extra ? b.backward_moments : b.backward_extra;
  };
  // --recompute full with routed rows (train/diagnostics_moe.cpp's costliest_rerun, walked here): each block l of
  // chunk k reruns with its own rows while micro-batch mb keeps the inputs of blocks up to l only (those past it
  // are done: past x [b s h] fewer); on a chunk without the head the output gradient it received stays beside
  // block l's own (+ [b s h] where l is not the last). The costliest block's (the rows differ by block: a capacity
  // keeps, --ep receives, each its own), in place of the whole chunk's count, which reads the last block's rows
  // for every block (under ZeRO-3 that put stage 1 of --dp 2 --ep 2 --layers 8 a block's reduce-scatter above
  // the measurement). A forward's (U) of block l, with as many inputs kept, is less than its rerun's, which
  // holds the rebuilt block too.
  auto rerun_extra = [&](size_t k, size_t mb, int64_t micro_batches, const ActivationPrediction& whole,
                         double pending_reduce) {
    if (!routed || (*routed)[k][mb].reruns.empty()) return own(whole);
    double most = 0;
    for (const ActivationCase& rerun : (*routed)[k][mb].reruns) {
      const bool last = rerun.rerun_blocks_after == 0;  // a deferred reduce-scatter is waited for at the last's
      const ActivationPrediction r = alone(k, mb, micro_batches, false, last ? pending_reduce : 0, &rerun);
      const double past = whole.per_micro_batch - r.per_micro_batch;
      const double received = !chunks[k].has_head && !last ? sent : 0;
      most = std::max(most, own(r) - past + received);
    }
    return most;
  };
  ActivationPrediction p;
  p.tokens = predict_activations(c).tokens;  // every micro-batch's copies (--cp), not one chunk's
  std::vector<bool> ran(chunks.size(), false);  // chunk k's backward (split: its W) has run: its .grad tensors are alive
  bool sending = false;
  double kept = 0, pending = 0;  // ZeRO-3: a deferred reduce-scatter in flight
  std::vector<bool> gathered(chunks.size(), false);  // ZeRO-3: chunk k's units gathered since its forward
  const std::vector<parallel::ScheduledOp> order = chunk_order(schedule, pp, stage, int(chunks.size()), c.micro_batches);
  const bool split = std::any_of(order.begin(), order.end(), [](const auto& op) { return op.kind == 'W'; });
  // The V's turn (its last rank): chunk 1's input is chunk 0's output, detached
  // (pipeline_p2p.cpp), and chunk 1's input gradient is chunk 0's output
  // gradient: [b s h] tensors both chunks' counts hold, alive once. Per
  // micro-batch, each chunk's state: '-', 'F' (kept until B), 'H' (held until W).
  const bool turn = split && chunks.size() == 2 && stage == pp - 1 &&
                    parallel::schedule_chunk_layout(schedule) == parallel::ChunkLayout::V;
  std::vector<std::array<char, 2>> state(size_t(c.micro_batches), {'-', '-'});
  // Chunk 1's input gradient waits for chunk 0's B: past chunk 1's W (whose held bytes counted it) it is
  // alone, a [b s h] more until that B starts (whose moments count the gradient received).
  std::vector<bool> waiting(size_t(c.micro_batches), false);
  auto twice = [&](int in_b) {  // in_b: the micro-batch whose chunk 0 runs B now (its moments hold the gradient)
    double n = 0;
    for (size_t i = 0; turn && i < state.size(); ++i) {
      const char c0 = state[i][0], c1 = state[i][1];
      n += (c0 == 'F' && c1 != '-') + ((c0 == 'H' || int(i) == in_b) && c1 == 'H') - (waiting[i] && c1 == '-');
    }
    return n * sent;
  };
  auto candidate = [&](double extra, int in_b) {
    const double now = kept - twice(in_b);
    if (now + extra > p.total) p.total = now + extra, p.backward_extra = extra, p.per_micro_batch = now;
  };
  // Zero-bubble sends are let go of at the op by which they are known delivered
  // (send_release.h): an input gradient whose W comes first is the send's
  // alone from W to there, and the first send on each link holds its header
  // from its op to there (let_go[j]: the bytes let go of at op j's start).
  // Only the split schedules' sends are held so (ZB-H1, ZB-V, DualPipeV; not the interleaved 1F1B's).
  const parallel::ChunkLayout layout = parallel::schedule_chunk_layout(schedule);
  std::vector<int> release;
  std::vector<double> let_go(order.size() + 1, 0);
  std::set<std::pair<char, int>> links;  // (kind, chunk) of the sends so far: one link each
  std::map<std::pair<int, int>, int> gradient_release;  // (mb, chunk) -> its B's send's release
  if (split) {
    std::vector<std::vector<parallel::ScheduledOp>> orders;
    for (int s = 0; s < pp; ++s) orders.push_back(chunk_order(schedule, pp, s, int(chunks.size()), c.micro_batches));
    release = parallel::send_release_points(orders, stage, layout);
  }
  for (size_t i = 0; i < order.size(); ++i) {
    const parallel::ScheduledOp& op = order[i];
    kept -= let_go[i];
    const size_t k = size_t(op.chunk), mb = routed ? size_t(op.mb) : 0;
    const ActivationPrediction &f = first[k][mb], &l = later[k][mb];  // the chunk's, this micro-batch's rows
    char& now = state[size_t(op.mb)][std::min<size_t>(k, 1)];
    // Posted after the op's compute: the first send on a link also holds its header.
    const bool first_on_link = split && release[i] >= 0 && links.insert({op.kind, op.chunk}).second;
    const double header = first_on_link ? parallel::kSendHeaderBytes : 0;
    if (header > 0) let_go[size_t(release[i])] += header;
    // Beside chunk k's op: the other chunks' ZeRO-3 units gathered since their forward (zero3_activations.h's
    // `between`) and .grad tensors (theirs once their backward ran; split: its own too).
    double beside = 0;
    for (size_t j = 0; j < chunks.size(); ++j)
      beside += (j != k && gathered[j] ? chunks[j].zero3.between : 0) +
                (ran[j] && (split || j != k) ? double(chunks[j].grad_bytes) : 0);
    if (op.kind == 'F') {
      kept += f.per_micro_batch + header, now = 'F';
      // A MoE block's forward (U), before the chunk's output exists: this micro-batch's rows.
      // (Split: the .grad tensors of its W's are `beside`, and its sends are let go of at their release.)
      const double unsplit = (ran[k] ? l : f).forward_extra + (sending ? sent : 0);
      if (f.forward_extra > 0) candidate((split ? f.forward_extra : unsplit) + beside, -1);
      gathered[k] = true;
      continue;
    }
    if (op.kind == 'W') {  // a split backward: W's first dW is a candidate peak, then W frees what B left it
      candidate(f.w_extra + beside, -1);
      kept -= f.held_until_w, now = '-';
      const auto it = gradient_release.find({op.mb, op.chunk});
      if (it != gradient_release.end() && size_t(it->second) > i)
        kept += sent, let_go[size_t(it->second)] += sent;  // its send still holds the input gradient
      ran[k] = true;
      continue;
    }
    if (turn) waiting[size_t(op.mb)] = k == 1;  // chunk 1's B makes it; chunk 0's B takes it
    // Split: B's own temporaries; the gradient it sends is the stage input's, held until W.
    const ActivationPrediction b = pending > 0 ? alone(k, mb, ran[k] ? 2 : 1, false, pending) : ran[k] ? l : f;
    const double unsplit = rerun_extra(k, mb, ran[k] ? 2 : 1, b, pending) + (sending ? sent : 0);
    candidate((split ? f.split_extra : unsplit) + beside, k == 0 ? op.mb : -1);
    kept -= f.per_micro_batch - header, now = '-';
    if (split && release[i] >= 0) gradient_release[{op.mb, op.chunk}] = release[i];
    if (split) kept += f.held_until_w, now = 'H';
    else ran[k] = true;
    // A chunk's last micro-batch syncs (interleaved_schedule.cpp), deferring its last reduce-scatter's wait.
    pending = !split && op.mb + 1 == c.micro_batches ? chunks[k].zero3.last_reduce : 0;
    gathered[k] = false;  // resharded by their reduce-scatters
    sending = sending || !chunks[k].has_embedding;
  }
  p.total += p.tokens;
  return p;
}

}  // namespace loom::optim
