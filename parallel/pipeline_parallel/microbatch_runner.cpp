#include "parallel/pipeline_parallel/microbatch_runner.h"

#include "autograd/functions.h"
#include "parallel/trace/trace.h"

namespace loom::parallel {

namespace {

// "F3", or with chunks "F3.1" (micro-batch 3 on chunk 1).
std::string event_name(char kind, int mb, int chunk, int num_chunks) {
  return num_chunks > 1 ? str(kind, mb, ".", chunk) : str(kind, mb);
}

}  // namespace

void check_stage_matches_rank(const PipelineStage& stage, const PipelineP2P& p2p) {
  LOOM_CHECK(stage.is_first_stage() == p2p.is_first_stage() && stage.is_last_stage() == p2p.is_last_stage(),
             "pipeline schedule: stage layers [", stage.range().start, ", ", stage.range(stage.num_chunks() - 1).end,
             ") do not match pipeline rank ", p2p.pp_rank(), " of ", p2p.pp_size());
}

double broadcast_mean_loss(PipelineP2P& p2p, double loss_sum, int m) {
  Tensor loss = full({}, loss_sum / double(m), kFloat64);
  p2p.pp_group().broadcast(loss, p2p.pp_size() - 1);
  return loss.item<double>();
}

MicroBatchRunner::MicroBatchRunner(PipelineStage& stage, PipelineP2P& p2p, const std::vector<MicroBatch>& mbs,
                                   const LossFn& loss_fn, DataParallel* dp)
    : stage_(stage), p2p_(p2p), mbs_(mbs), loss_fn_(loss_fn), dp_(dp) {
  LOOM_CHECK(!mbs.empty(), "pipeline schedule: no micro-batches");
  check_stage_matches_rank(stage, p2p);
  for (size_t i = 1; i < mbs.size(); ++i)
    LOOM_CHECK(mbs[i].x.shape() == mbs[0].x.shape(), "pipeline schedule: micro-batch ", i, " has shape ",
               shape_str(mbs[i].x.shape()), ", micro-batch 0 ", shape_str(mbs[0].x.shape()),
               "; a step's micro-batches must have one shape");
  p2p_.begin_schedule();
}

Tensor MicroBatchRunner::forward(int mb, const Tensor& input, int chunk) {
  trace::Span span(event_name('F', mb, chunk, stage_.num_chunks()));
  const double t0 = schedule_clock_us();
  // [b, T, C] (T / tp under sequence parallelism): micro-batch mb's rows and tokens, the model's width.
  if (!stage_.chunk_is_first(chunk))
    expect_received("activation", mb, input, stage_.activation_shape(mbs_[size_t(mb)].x.shape()));
  Tensor in = stage_.chunk_is_first(chunk) ? mbs_[size_t(mb)].x : input;
  Tensor out = stage_.forward(in, chunk);
  if (stage_.chunk_is_last(chunk)) {
    Tensor loss = loss_fn_(out, mbs_[size_t(mb)].y);
    loss_sum_ += loss.item<double>();
    out = autograd::mul(loss, 1.0 / double(num_microbatches()));
  }
  in_flight_[{mb, chunk}] = {in, out};
  events_.push_back({'F', mb, t0, schedule_clock_us(), chunk});
  return out;
}

Tensor MicroBatchRunner::backward(int mb, const Tensor& output_grad, bool sync, int chunk) {
  trace::Span span(event_name('B', mb, chunk, stage_.num_chunks()));
  const double t0 = schedule_clock_us();
  auto it = in_flight_.find({mb, chunk});
  LOOM_CHECK(it != in_flight_.end(), "pipeline schedule: backward of micro-batch ", mb, " (chunk ", chunk,
             ") before its forward");
  const Tensor input = it->second.first, output = it->second.second;
  in_flight_.erase(it);  // the graph is freed by backward; drop our handles too
  if (!stage_.chunk_is_last(chunk)) expect_received("gradient", mb, output_grad, output.shape());
  Tensor input_grad;
  auto run = [&] { input_grad = stage_.backward(input, output, output_grad, chunk); };
  if (dp_ && !sync) {
    auto no_sync = dp_->no_sync();
    run();
  } else if (dp_) {
    auto defer = dp_->defer_grad_sync();  // the reductions launch here; finish() waits for them
    run();
  } else {
    run();
  }
  events_.push_back({'B', mb, t0, schedule_clock_us(), chunk});
  return input_grad;
}

void MicroBatchRunner::expect_received(const char* what, int mb, const Tensor& t, const Shape& want) const {
  LOOM_CHECK(t.defined() && t.shape() == want, "pipeline: stage ", p2p_.pp_rank(), " received ",
             t.defined() ? t.describe() : std::string("nothing"), " as the ", what, " of micro-batch ", mb,
             ", expected shape ", want, "; do all ranks run the same model and batch flags?");
}

PipelineStepResult MicroBatchRunner::finish() {
  p2p_.end_schedule();
  LOOM_CHECK(in_flight_.empty(), "pipeline schedule: ", in_flight_.size(), " micro-batches never ran backward");
  // The dp gradient sync waits here, after the last transfer, not inside the
  // last backward (Megatron's finalize_model_grads after the schedule): there
  // it would hold back this stage's last send_backward, and stage s - 1's last
  // backward with it, so the cool-down would grow by every stage's exposed dp time in turn.
  if (dp_) dp_->finish_grad_sync();
  return {broadcast_mean_loss(p2p_, loss_sum_, num_microbatches()), std::move(events_)};
}

}  // namespace loom::parallel
