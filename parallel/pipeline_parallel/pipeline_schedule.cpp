#include "parallel/pipeline_parallel/pipeline_schedule.h"

#include <algorithm>
#include <map>

#include "autograd/functions.h"
#include "parallel/trace/trace.h"
#include "tensor/grad_mode.h"

namespace loom::parallel {

namespace {

void check_stage_matches_rank(const PipelineStage& stage, const PipelineP2P& p2p) {
  LOOM_CHECK(stage.is_first_stage() == p2p.is_first_stage() && stage.is_last_stage() == p2p.is_last_stage(),
             "pipeline schedule: stage layers [", stage.range().start, ", ", stage.range().end,
             ") do not match pipeline rank ", p2p.pp_rank(), " of ", p2p.pp_size());
}

// The loss exists on the last stage only; rank 0, which prints, is the first.
// Every stage returns the last stage's mean over the m micro-batches.
double broadcast_mean_loss(PipelineP2P& p2p, double loss_sum, int m) {
  Tensor loss = full({}, loss_sum / double(m), kFloat64);
  p2p.pp_group().broadcast(loss, p2p.pp_size() - 1);
  return loss.item<double>();
}

// What both schedules do with one micro-batch; they differ only in the order
// they call forward() and backward() and in how they pair the transfers.
class MicroBatchRunner {
 public:
  MicroBatchRunner(PipelineStage& stage, PipelineP2P& p2p, const std::vector<MicroBatch>& mbs, const LossFn& loss_fn,
                   DataParallel* dp)
      : stage_(stage), p2p_(p2p), mbs_(mbs), loss_fn_(loss_fn), dp_(dp) {
    LOOM_CHECK(!mbs.empty(), "pipeline schedule: no micro-batches");
    check_stage_matches_rank(stage, p2p);
  }
  int num_microbatches() const { return int(mbs_.size()); }

  // Micro-batch mb's forward on `input` (received; undefined on the first
  // stage, which reads the token ids). Returns what goes downstream: the
  // activation, or on the last stage the loss scaled by 1/m. Keeps input and
  // output until the backward - these are the activations a schedule holds.
  Tensor forward(int mb, const Tensor& input) {
    trace::Span span(str("F", mb));
    const double t0 = schedule_clock_us();
    if (!stage_.is_first_stage()) expect_received("activation", mb, input, activation_shape(mb));
    Tensor in = stage_.is_first_stage() ? mbs_[size_t(mb)].x : input;
    Tensor out = stage_.forward(in);
    if (stage_.is_last_stage()) {
      Tensor loss = loss_fn_(out, mbs_[size_t(mb)].y);
      loss_sum_ += loss.item<double>();
      out = autograd::mul(loss, 1.0 / double(num_microbatches()));
    }
    in_flight_[mb] = {in, out};
    events_.push_back({'F', mb, t0, schedule_clock_us()});
    return out;
  }

  // Micro-batch mb's backward from output_grad (received; undefined on the
  // last stage, which starts from its loss). Returns d loss / d input, to send
  // upstream. Every backward but the last micro-batch's skips the dp sync; the
  // last launches it, and finish() waits for it after the last transfer.
  Tensor backward(int mb, const Tensor& output_grad) {
    trace::Span span(str("B", mb));
    const double t0 = schedule_clock_us();
    auto it = in_flight_.find(mb);
    LOOM_CHECK(it != in_flight_.end(), "pipeline schedule: backward of micro-batch ", mb, " before its forward");
    const Tensor input = it->second.first, output = it->second.second;
    in_flight_.erase(it);  // the graph is freed by backward; drop our handles too
    if (!stage_.is_last_stage()) expect_received("gradient", mb, output_grad, output.shape());
    Tensor input_grad;
    auto run = [&] { input_grad = stage_.backward(input, output, output_grad); };
    if (dp_ && mb + 1 < num_microbatches()) {
      auto no_sync = dp_->no_sync();
      run();
    } else if (dp_) {
      auto defer = dp_->defer_grad_sync();  // the reductions launch here; finish() waits
      run();
    } else {
      run();
    }
    events_.push_back({'B', mb, t0, schedule_clock_us()});
    return input_grad;
  }

  // A received tensor must have the shape this stage computes with: a rank
  // started with other --embd / --batch / --block sends another shape, which
  // would fail deep inside a matmul or, worse, broadcast silently.
  void expect_received(const char* what, int mb, const Tensor& t, const Shape& want) const {
    LOOM_CHECK(t.defined() && t.shape() == want, "pipeline: stage ", p2p_.pp_rank(), " received ",
               t.defined() ? t.describe() : std::string("nothing"), " as the ", what, " of micro-batch ", mb,
               ", expected shape ", want, "; do all ranks run the same model and batch flags?");
  }
  // [b, T, C]: micro-batch mb's rows and tokens (T / tp under sequence parallelism), the model's width.
  Shape activation_shape(int mb) const { return stage_.activation_shape(mbs_[size_t(mb)].x.shape()); }

  // After the last transfer: finish the dp gradient sync, give every stage the
  // mean loss. The sync waits here, not inside the last backward (Megatron's
  // finalize_model_grads after the schedule): there it would hold back this
  // stage's last send_backward, and stage s - 1's last backward with it, so the
  // pipeline's cool-down would grow by every stage's exposed dp time in turn.
  PipelineStepResult finish() {
    LOOM_CHECK(in_flight_.empty(), "pipeline schedule: ", in_flight_.size(), " micro-batches never ran backward");
    if (dp_) dp_->finish_grad_sync();
    return {broadcast_mean_loss(p2p_, loss_sum_, num_microbatches()), std::move(events_)};
  }

 private:
  PipelineStage& stage_;
  PipelineP2P& p2p_;
  const std::vector<MicroBatch>& mbs_;
  const LossFn& loss_fn_;
  DataParallel* dp_;
  std::map<int, std::pair<Tensor, Tensor>> in_flight_;  // mb -> (input, output)
  double loss_sum_ = 0;
  StageEvents events_;
};

}  // namespace

// GPipe: m forwards, then m backwards (picotron's train_step_pipeline_afab).
PipelineStepResult train_step_pipeline_afab(PipelineStage& stage, PipelineP2P& p2p,
                                            const std::vector<MicroBatch>& micro_batches, const LossFn& loss_fn,
                                            DataParallel* dp) {
  MicroBatchRunner run(stage, p2p, micro_batches, loss_fn, dp);
  const int m = run.num_microbatches();
  for (int mb = 0; mb < m; ++mb) {
    Tensor input = p2p.recv_forward(mb);
    p2p.send_forward(run.forward(mb, input), mb);
  }
  for (int mb = 0; mb < m; ++mb) {
    Tensor output_grad = p2p.recv_backward(mb);
    p2p.send_backward(run.backward(mb, output_grad), mb);
  }
  return run.finish();
}

// 1F1B (picotron's train_step_pipeline_1f1b; Megatron's
// forward_backward_pipelining_without_interleaving). Stage s of p:
//   warm-up    min(p - s - 1, m) forwards: fill the pipeline below this stage
//   steady     m - warm-up times: forward mb f, then backward mb b (b = f - warm-up)
//   cool-down  the warm-up's backwards
// so at most warm-up + 1 = p - s micro-batches are in flight on stage s.
PipelineStepResult train_step_pipeline_1f1b(PipelineStage& stage, PipelineP2P& p2p,
                                            const std::vector<MicroBatch>& micro_batches, const LossFn& loss_fn,
                                            DataParallel* dp) {
  MicroBatchRunner run(stage, p2p, micro_batches, loss_fn, dp);
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
    Tensor input_grad = run.backward(b, output_grad);
    if (i + 1 == steady) p2p.send_backward(input_grad, b);   // no forward left to receive
    else input = p2p.send_bwd_recv_fwd(input_grad, b, f + 1);
  }

  for (int i = 0; i < warmup; ++i, ++b) {
    Tensor output_grad = p2p.recv_backward(b);
    p2p.send_backward(run.backward(b, output_grad), b);
  }
  return run.finish();
}

// Validation: AFAB's forward loop without its backward loop. Under
// NoGradGuard no op records a graph node, so each activation is freed as soon
// as it has been sent (the stage still marks a received input requires_grad,
// but nothing reads that flag here), and no parameter gets a .grad.
double eval_step_pipeline(PipelineStage& stage, PipelineP2P& p2p, const std::vector<MicroBatch>& micro_batches,
                          const LossFn& loss_fn) {
  LOOM_CHECK(!micro_batches.empty(), "eval_step_pipeline: no micro-batches");
  check_stage_matches_rank(stage, p2p);
  NoGradGuard no_grad;
  const int m = int(micro_batches.size());
  double loss_sum = 0;
  for (int mb = 0; mb < m; ++mb) {
    Tensor input = p2p.recv_forward(mb);  // undefined on the first stage: it reads the token ids
    Tensor output;
    {
      trace::Span span(str("F", mb));
      output = stage.forward(stage.is_first_stage() ? micro_batches[size_t(mb)].x : input);
    }
    if (stage.is_last_stage()) loss_sum += loss_fn(output, micro_batches[size_t(mb)].y).item<double>();
    p2p.send_forward(output, mb);  // no-op on the last stage
  }
  return broadcast_mean_loss(p2p, loss_sum, m);
}

}  // namespace loom::parallel
