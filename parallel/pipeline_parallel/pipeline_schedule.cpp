#include "parallel/pipeline_parallel/pipeline_schedule.h"

#include <algorithm>

#include "parallel/trace/trace.h"
#include "tensor/grad_mode.h"

namespace loom::parallel {

// GPipe: m forwards, then m backwards (picotron's train_step_pipeline_afab).
ForwardBackwardResult train_step_pipeline_afab(ModelChunks& stage, PipelineP2P& p2p,
                                               const std::vector<MicroBatch>& micro_batches, const LossFn& loss_fn,
                                               DataParallel* dp) {
  MicroBatchRunner run(stage, &p2p, micro_batches, loss_fn, dp);
  const int m = run.num_microbatches();
  for (int mb = 0; mb < m; ++mb) {
    Tensor input = p2p.recv_forward(mb);
    p2p.send_forward(run.forward(mb, input), mb);
  }
  for (int mb = 0; mb < m; ++mb) {
    Tensor output_grad = p2p.recv_backward(mb);
    p2p.send_backward(run.backward(mb, output_grad, /*sync=*/mb + 1 == m), mb);
  }
  return run.finish();
}

// 1F1B (picotron's train_step_pipeline_1f1b; Megatron's
// forward_backward_pipelining_without_interleaving). Stage s of p:
//   warm-up    min(p - s - 1, m) forwards: fill the pipeline below this stage
//   steady     m - warm-up times: forward mb f, then backward mb b (b = f - warm-up)
//   cool-down  the warm-up's backwards
// so at most warm-up + 1 = p - s micro-batches are in flight on stage s.
ForwardBackwardResult train_step_pipeline_1f1b(ModelChunks& stage, PipelineP2P& p2p,
                                               const std::vector<MicroBatch>& micro_batches, const LossFn& loss_fn,
                                               DataParallel* dp) {
  MicroBatchRunner run(stage, &p2p, micro_batches, loss_fn, dp);
  const int m = run.num_microbatches();
  const int warmup = std::min(p2p.pp_size() - p2p.pp_rank() - 1, m);
  const int steady = m - warmup;
  int f = 0, b = 0;  // the next micro-batch to run forward / backward

  for (int i = 0; i < warmup; ++i, ++f) {
    Tensor input = p2p.recv_forward(f);
    p2p.send_forward(run.forward(f, input), f);
  }

  Tensor input;
  if (steady > 0) input = p2p.recv_forward(f);
  for (int i = 0; i < steady; ++i, ++f, ++b) {
    // Send this forward's output and wait for the gradient of the oldest
    // micro-batch in flight: the next stage sends it right after its own backward.
    Tensor output_grad = p2p.send_fwd_recv_bwd(run.forward(f, input), f, b);
    Tensor input_grad = run.backward(b, output_grad, /*sync=*/b + 1 == m);
    if (i + 1 == steady) p2p.send_backward(input_grad, b);   // no forward left to receive
    else input = p2p.send_bwd_recv_fwd(input_grad, b, f + 1);
  }

  for (int i = 0; i < warmup; ++i, ++b) {
    Tensor output_grad = p2p.recv_backward(b);
    p2p.send_backward(run.backward(b, output_grad, /*sync=*/b + 1 == m), b);
  }
  return run.finish();
}

// Validation: AFAB's forward loop without its backward loop. Under
// NoGradGuard no op records a graph node, so each activation is freed as soon
// as it has been sent (the stage still marks a received input requires_grad,
// but nothing reads that flag here), and no parameter gets a .grad. With
// chunks (virtual stages) a micro-batch goes round the ring v times, one
// chunk after another, before the next micro-batch starts.
double eval_step_pipeline(ModelChunks& stage, PipelineP2P& p2p, const std::vector<MicroBatch>& micro_batches,
                          const LossFn& loss_fn) {
  LOOM_CHECK(!micro_batches.empty(), "eval_step_pipeline: no micro-batches");
  check_stage_matches_rank(stage, &p2p);
  NoGradGuard no_grad;
  const int m = int(micro_batches.size());
  double loss_sum = 0;
  p2p.begin_schedule();
  for (int mb = 0; mb < m; ++mb)
    for (int c = 0; c < stage.num_chunks(); ++c) {
      // The first virtual stage reads the token ids; the others receive (around the ring).
      Tensor input = stage.chunk_is_first(c) ? micro_batches[size_t(mb)].x : p2p.recv_activation(mb, c);
      Tensor output;
      {
        trace::Span span(stage.num_chunks() > 1 ? str("F", mb, ".", c) : str("F", mb));
        output = stage.forward(input, c);
      }
      if (stage.chunk_is_last(c)) loss_sum += loss_fn(output, micro_batches[size_t(mb)].y).item<double>();
      else p2p.send_activation(output, mb, c);
    }
  p2p.end_schedule();
  return broadcast_mean_loss(&p2p, loss_sum, m);
}

}  // namespace loom::parallel
