// AdamW (Loshchilov & Hutter 2019): Adam with decoupled weight decay, exactly
// torch.optim.AdamW's update (see tensor/kernels/adamw.h for the math). One
// fused loop per param over contiguous data, not a chain of tensor ops: the
// optimizer step touches every weight and its two moments once, so it is
// memory-bound and each extra pass costs.
//
// State per param: step (int64 scalar, counts this param's updates, for its
// bias correction), exp_avg and exp_avg_sq (fp32; float64 for float64 params).
// bf16/fp16 params are updated in fp32 and rounded back each step; keeping
// fp32 main params so small updates are not rounded away is the mixed-precision
// optimizer's job.
#pragma once

#include "optim/optimizer.h"
#include "tensor/kernels/adamw.h"

namespace loom::optim {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

// Errors unless 0 <= beta1, beta2 < 1 and eps >= 0.
void check_adamw_options(const AdamWOptions& o);

struct AdamWState {
  Tensor step;        // int64 [], number of updates taken
  Tensor exp_avg;     // m, shape of the param
  Tensor exp_avg_sq;  // v, shape of the param
};

// One AdamW update of param (fp32, bf16, fp16 or fp64; on any device) and its
// state from grad (contiguous, in the moments' dtype), counting the step in
// state.step. AdamW::step runs it for every param, MixedPrecisionOptimizer for
// every fp32 main param: the update is written once, so the two agree bit for bit.
void adamw_update(const Tensor& param, const AdamWState& state, const Tensor& grad, double lr, double weight_decay,
                  const AdamWOptions& o);

class AdamW : public Optimizer {
 public:
  explicit AdamW(std::vector<ParamGroup> groups, AdamWOptions options = {});
  void step() override;

  const AdamWOptions& options() const { return options_; }
  const AdamWState& state(size_t group, size_t index) const { return state_.at(group).at(index); }

 protected:
  NamedTensors param_state(size_t group, size_t index) const override;

 private:
  AdamWOptions options_;
  std::vector<std::vector<AdamWState>> state_;  // [group][param]
};

}  // namespace loom::optim
