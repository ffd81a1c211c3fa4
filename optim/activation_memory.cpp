#include "optim/activation_memory.h"

#include <algorithm>
#include <string>

namespace loom::optim {

ActivationPrediction predict_activations(const ActivationCase& c) {
  const double b = double(c.micro_batch), s = double(c.seq), h = double(c.width), a = double(c.heads),
               t = double(c.tp), V = double(c.vocab);
  const double unit = b * s * h * double(c.element_bytes);  // one [b, s, h] tensor
  const double split = (12 + a * s / h) / t;                // q, k, v, softmax, merged heads, 4h twice
  const double replicated = c.sequence_parallel ? 2 / t + 2 : 4;
  ActivationPrediction p;
  p.per_block = unit * (replicated + split);
  // The stage's output (kept for the pipeline's backward, or by ln_f); ln_f's
  // output and the fp32 logits on the stage with the head.
  const double logits = c.has_head ? b * s * V / t * 4 : 0;
  p.per_micro_batch = double(c.blocks) * p.per_block + unit * (1 + (c.has_head ? 1 : 0)) + logits;
  // First backward: the logits' gradient; [b, s, h]-sized fp32 gradients in
  // flight, 2 / t (fp32 model) or 6 / t (16-bit: the kernels' fp32 working
  // copies); on a pipeline stage the gradient received and the one sent.
  const double fp32_unit = b * s * h * 4;
  p.backward_extra = logits + fp32_unit * (c.element_bytes == 4 ? 2 : 6) / t + (c.pipelined ? 2 * unit : 0);
  if (c.pipelined && double(c.micro_batches) > c.in_flight) p.backward_extra += double(c.grad_bytes);
  p.total = c.in_flight * p.per_micro_batch + p.backward_extra;
  return p;
}

double micro_batches_in_flight(const char* schedule, int64_t micro_batches, int pp, int stage, int virtual_stages) {
  const double m = double(micro_batches);
  if (pp <= 1) return 1;  // gradient accumulation: one micro-batch at a time
  if (std::string(schedule) == "afab") return m;
  if (virtual_stages <= 1) return std::min(m, double(pp - stage));
  // Interleaved (interleaved_schedule.cpp): warm-up forwards of single chunks, then the first backward.
  const int64_t total = micro_batches * virtual_stages;
  const int64_t warmup = micro_batches == pp ? total
                                             : std::min<int64_t>((pp - stage - 1) * 2 + (virtual_stages - 1) * pp, total);
  return double(std::min<int64_t>(warmup + 1, total)) / virtual_stages;
}

}  // namespace loom::optim
