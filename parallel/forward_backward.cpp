#include "parallel/forward_backward.h"

#include "parallel/pipeline_parallel/dualpipev_schedule.h"
#include "parallel/pipeline_parallel/interleaved_schedule.h"
#include "parallel/pipeline_parallel/pipeline_schedule.h"
#include "parallel/pipeline_parallel/zbv_schedule.h"
#include "parallel/pipeline_parallel/zero_bubble_schedule.h"
#include "tensor/grad_mode.h"

namespace loom::parallel {

ForwardBackwardResult forward_backward_no_pipelining(ModelChunks& model, const std::vector<MicroBatch>& micro_batches,
                                                     const LossFn& loss_fn, DataParallel* dp) {
  MicroBatchRunner run(model, /*p2p=*/nullptr, micro_batches, loss_fn, dp);
  const int m = run.num_microbatches();
  // Only the last backward syncs over dp: the others run inside no_sync().
  for (int mb = 0; mb < m; ++mb) {
    run.forward(mb, Tensor());
    run.backward(mb, Tensor(), /*sync=*/mb + 1 == m);
  }
  return run.finish();
}

ForwardBackwardResult forward_backward(Model& model, const std::vector<MicroBatch>& micro_batches,
                                       const std::string& schedule, const LossFn& loss_fn, DataParallel* dp,
                                       bool overlap_pairs) {
  LOOM_CHECK(!overlap_pairs || schedule == "dualpipev", "forward_backward: overlapped pairs are DualPipeV's; schedule '",
             schedule, "' has none");
  if (!model.p2p) return forward_backward_no_pipelining(*model.chunks, micro_batches, loss_fn, dp);
  ModelChunks& stage = *model.chunks;
  PipelineP2P& p2p = *model.p2p;
  if (schedule == "zb-v") return train_step_pipeline_zb_v(stage, p2p, micro_batches, loss_fn, dp);
  if (schedule == "dualpipev") return train_step_pipeline_dualpipev(stage, p2p, micro_batches, loss_fn, dp, overlap_pairs);
  if (stage.num_chunks() > 1) return train_step_pipeline_interleaved(stage, p2p, micro_batches, loss_fn, dp);
  if (schedule == "afab") return train_step_pipeline_afab(stage, p2p, micro_batches, loss_fn, dp);
  if (schedule == "zb-h1") return train_step_pipeline_zb_h1(stage, p2p, micro_batches, loss_fn, dp);
  LOOM_CHECK(schedule == "1f1b", "forward_backward: unknown schedule '", schedule,
             "' (afab, 1f1b, zb-h1, zb-v or dualpipev)");
  return train_step_pipeline_1f1b(stage, p2p, micro_batches, loss_fn, dp);
}

double forward_only(Model& model, const std::vector<MicroBatch>& micro_batches) {
  ModelChunks& chunks = *model.chunks;
  return forward_only(model, micro_batches, [&chunks](const Tensor& logits, const Tensor& y) { return chunks.loss(logits, y); });
}

double forward_only(Model& model, const std::vector<MicroBatch>& micro_batches, const LossFn& loss_fn) {
  ModelChunks& chunks = *model.chunks;
  if (model.p2p) return eval_step_pipeline(chunks, *model.p2p, micro_batches, loss_fn);
  LOOM_CHECK(!micro_batches.empty(), "forward_only: no micro-batches");
  NoGradGuard no_grad;
  double total = 0;
  for (const MicroBatch& mb : micro_batches) total += loss_fn(chunks.forward(mb.x), mb.y).item<double>();
  return total / double(micro_batches.size());
}

}  // namespace loom::parallel
