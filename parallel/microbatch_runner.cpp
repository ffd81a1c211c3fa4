#include "parallel/microbatch_runner.h"

#include "autograd/functions.h"

namespace loom::parallel {

void check_stage_matches_rank(const ModelChunks& model, const PipelineP2P* p2p) {
  const bool first = p2p ? p2p->is_first_stage() : true, last = p2p ? p2p->is_last_stage() : true;
  LOOM_CHECK(model.is_first_stage() == first && model.is_last_stage() == last, "schedule: layers [",
             model.range().start, ", ", model.range(model.num_chunks() - 1).end, ") do not match pipeline rank ",
             p2p ? p2p->pp_rank() : 0, " of ", p2p ? p2p->pp_size() : 1);
}

double broadcast_mean_loss(PipelineP2P* p2p, double loss_sum, int m) {
  Tensor loss = full({}, loss_sum / double(m), kFloat64);
  if (p2p) p2p->pp_group().broadcast(loss, p2p->last_stage_rank());
  return loss.item<double>();
}

MicroBatchRunner::MicroBatchRunner(ModelChunks& model, PipelineP2P* p2p, const std::vector<MicroBatch>& mbs,
                                   const LossFn& loss_fn, DataParallel* dp)
    : model_(model), p2p_(p2p), mbs_(mbs), loss_fn_(loss_fn), dp_(dp), recorder_(p2p != nullptr, model.num_chunks()) {
  LOOM_CHECK(!mbs.empty(), "schedule: no micro-batches");
  check_stage_matches_rank(model, p2p);
  for (size_t i = 1; i < mbs.size(); ++i)
    LOOM_CHECK(mbs[i].x.shape() == mbs[0].x.shape(), "pipeline schedule: micro-batch ", i, " has shape ",
               shape_str(mbs[i].x.shape()), ", micro-batch 0 ", shape_str(mbs[0].x.shape()),
               "; a step's micro-batches must have one shape");
  if (p2p_) p2p_->begin_schedule();
}

Tensor MicroBatchRunner::forward(int mb, const Tensor& input, int chunk) {
  ScheduleRecorder::Op recorded(recorder_, 'F', mb, chunk);  // a trace span and --print-schedule's event
  // [b, T, C] (T / tp under sequence parallelism): micro-batch mb's rows and tokens, the model's width.
  if (!model_.chunk_is_first(chunk))
    expect_received("activation", mb, input, model_.activation_shape(mbs_[size_t(mb)].x.shape()));
  Tensor in = model_.chunk_is_first(chunk) ? mbs_[size_t(mb)].x : input;
  Tensor out = model_.forward(in, chunk);
  if (model_.chunk_is_last(chunk)) {
    Tensor loss = loss_fn_(out, mbs_[size_t(mb)].y);
    loss_sum_ += loss.item<double>();
    out = autograd::mul(loss, 1.0 / double(num_microbatches()));
  }
  std::lock_guard<std::mutex> lock(in_flight_mutex_);
  in_flight_[{mb, chunk}] = {in, out};
  return out;
}

std::pair<Tensor, Tensor> MicroBatchRunner::take_in_flight(int mb, const Tensor& output_grad, int chunk) {
  std::unique_lock<std::mutex> lock(in_flight_mutex_);
  auto it = in_flight_.find({mb, chunk});
  LOOM_CHECK(it != in_flight_.end(), "schedule: backward of micro-batch ", mb, " (chunk ", chunk,
             ") before its forward");
  auto [input, output] = it->second;
  in_flight_.erase(it);  // the graph is freed by backward; drop our handles too
  lock.unlock();
  if (!model_.chunk_is_last(chunk)) expect_received("gradient", mb, output_grad, output.shape());
  return {input, output};
}

void MicroBatchRunner::with_dp_sync(bool sync, const std::function<void()>& fn) {
  if (dp_ && !sync) {
    auto no_sync = dp_->no_sync();
    fn();
  } else if (dp_) {
    auto defer = dp_->defer_grad_sync();  // the reductions launch here; finish() waits for them
    fn();
  } else {
    fn();
  }
}

Tensor MicroBatchRunner::backward(int mb, const Tensor& output_grad, bool sync, int chunk) {
  ScheduleRecorder::Op recorded(recorder_, 'B', mb, chunk);
  // (input, output), not a structured binding: clang 14 (CI's) cannot capture one in the lambda below.
  const std::pair<Tensor, Tensor> in_flight = take_in_flight(mb, output_grad, chunk);
  Tensor input_grad;
  with_dp_sync(sync, [&] { input_grad = model_.backward(in_flight.first, in_flight.second, output_grad, chunk); });
  return input_grad;
}

Tensor MicroBatchRunner::backward_input(int mb, const Tensor& output_grad, int chunk) {
  ScheduleRecorder::Op recorded(recorder_, 'B', mb, chunk);
  const auto [input, output] = take_in_flight(mb, output_grad, chunk);
  return model_.backward(input, output, output_grad, chunk, &weight_grads_[{mb, chunk}]);
}

void MicroBatchRunner::backward_weight(int mb, bool sync, int chunk) {
  ScheduleRecorder::Op recorded(recorder_, 'W', mb, chunk);
  auto it = weight_grads_.find({mb, chunk});
  LOOM_CHECK(it != weight_grads_.end(), "schedule: W of micro-batch ", mb, " (chunk ", chunk, ") before its B");
  autograd::WeightGrads w = std::move(it->second);
  weight_grads_.erase(it);
  with_dp_sync(sync, [&] { autograd::Engine::run_weight_grads(w); });
}

void MicroBatchRunner::expect_received(const char* what, int mb, const Tensor& t, const Shape& want) const {
  LOOM_CHECK(t.defined() && t.shape() == want, "pipeline: stage ", p2p_ ? p2p_->pp_rank() : 0, " received ",
             t.defined() ? t.describe() : std::string("nothing"), " as the ", what, " of micro-batch ", mb,
             ", expected shape ", want, "; do all ranks run the same model and batch flags?");
}

ForwardBackwardResult MicroBatchRunner::finish() {
  if (p2p_) p2p_->end_schedule();
  LOOM_CHECK(in_flight_.empty(), "pipeline schedule: ", in_flight_.size(), " micro-batches never ran backward");
  LOOM_CHECK(weight_grads_.empty(), "pipeline schedule: ", weight_grads_.size(), " micro-batches never ran W");
  // The dp gradient sync waits here, after the last transfer, not inside the
  // last backward (Megatron's finalize_model_grads after the schedule): there
  // it would hold back this stage's last send_backward, and stage s - 1's last
  // backward with it, so the cool-down would grow by every stage's exposed dp time in turn.
  if (dp_) dp_->finish_grad_sync();
  return {broadcast_mean_loss(p2p_, loss_sum_, num_microbatches()), recorder_.take_events()};
}

}  // namespace loom::parallel
