#include "parallel/pipeline_parallel/interleaved_schedule.h"

#include <algorithm>


namespace loom::parallel {

namespace {

void check_interleaving(int pp_size, int num_chunks, int num_microbatches) {
  LOOM_CHECK(pp_size >= 2 && num_chunks >= 1, "interleaved 1F1B: needs pp >= 2 and at least one chunk, got pp ",
             pp_size, " and ", num_chunks, " chunks");
  LOOM_CHECK(num_microbatches > 0 && num_microbatches % pp_size == 0, "interleaved 1F1B: ", num_microbatches,
             " micro-batches are not a multiple of pp ", pp_size,
             " (Megatron's requirement: micro-batches go through the chunks in groups of pp); use --microbatches ",
             std::max(1, (num_microbatches + pp_size - 1) / pp_size) * pp_size);
}

}  // namespace

std::vector<ScheduledOp> interleaved_order(int p, int rank, int v, int m) {
  check_interleaving(p, v, m);
  // Megatron's get_model_chunk_id and get_microbatch_id_in_model_chunk.
  auto op = [&](char kind, int k) {
    const int in_group = k % (p * v);
    const int chunk = in_group / p;
    return ScheduledOp{kind, (k / (p * v)) * p + k % p, kind == 'F' ? chunk : v - 1 - chunk};
  };
  const int total = m * v;
  // Warm-up: fill the ring below this rank twice over ((p - r - 1) 2), plus a
  // group of p for every chunk after the first; all of them when m = p.
  const int warmup = m == p ? total : std::min((p - rank - 1) * 2 + (v - 1) * p, total);
  std::vector<ScheduledOp> order;
  for (int k = 0; k < warmup; ++k) order.push_back(op('F', k));
  for (int k = 0; k < total - warmup; ++k) {  // steady 1F1B
    order.push_back(op('F', warmup + k));
    order.push_back(op('B', k));
  }
  for (int k = total - warmup; k < total; ++k) order.push_back(op('B', k));  // cool-down
  return order;
}

ForwardBackwardResult train_step_pipeline_interleaved(ModelChunks& stage, PipelineP2P& p2p,
                                                      const std::vector<MicroBatch>& micro_batches,
                                                      const LossFn& loss_fn, DataParallel* dp) {
  // Around the ring every stage sends before it receives: the schedule's sends
  // do not wait for their receivers (pipeline_channels.h).
  MicroBatchRunner run(stage, &p2p, micro_batches, loss_fn, dp);
  const int m = run.num_microbatches();
  const std::vector<ScheduledOp> order = interleaved_order(p2p.pp_size(), p2p.pp_rank(), stage.num_chunks(), m);
  // When the gradients are synced over dp (see the header).
  const bool sync_at_the_end = dp && dp->syncs_once_per_step();
  auto sync = [&](size_t i) { return sync_at_the_end ? i + 1 == order.size() : order[i].mb + 1 == m; };

  for (size_t i = 0; i < order.size(); ++i) {
    const auto [kind, mb, c] = order[i];
    if (kind == 'F') {
      // The first virtual stage reads token ids; the last keeps its loss.
      Tensor input = stage.chunk_is_first(c) ? Tensor() : p2p.recv_activation(mb, c);
      Tensor output = run.forward(mb, input, c);
      if (!stage.chunk_is_last(c)) p2p.send_activation(output, mb, c);
    } else {
      // The last virtual stage starts from its loss; the first sends nothing upstream.
      Tensor output_grad = stage.chunk_is_last(c) ? Tensor() : p2p.recv_gradient(mb, c);
      Tensor input_grad = run.backward(mb, output_grad, sync(i), c);
      if (!stage.chunk_is_first(c)) p2p.send_gradient(input_grad, mb, c);
    }
  }
  return run.finish();
}

}  // namespace loom::parallel
