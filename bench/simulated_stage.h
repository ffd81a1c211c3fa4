// A pipeline stage whose work takes a fixed time without using a core: every
// micro-batch's forward also sleeps F and its backward 2F (a backward costs
// about two forwards). With a tiny model the stages then take equal, fixed
// times without competing for cores - the theory's premise, one device per
// stage - so a bench measures the schedule's own bubble and transfers, even
// with more stages than cores. Shared by bench_pipeline_memory and
// bench_pipeline_grad_sync.
#pragma once

#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "autograd/function.h"
#include "parallel/pipeline_parallel/pipeline_stage.h"
#include "tensor/ops.h"

namespace loom::bench {

// The identity, but its forward sleeps f and its backward 2f.
inline Tensor simulated_compute(const Tensor& x, std::chrono::microseconds f) {
  std::this_thread::sleep_for(f);
  return autograd::record("SimulatedCompute", {&x}, ops::view(x, x.shape()), [f](const autograd::TensorList& g) {
    std::this_thread::sleep_for(2 * f);
    return autograd::TensorList{g[0]};
  });
}

class SimulatedStage : public parallel::PipelineStage {
 public:
  SimulatedStage(const nn::GPTConfig& cfg, std::vector<parallel::LayerRange> chunks, std::chrono::microseconds f)
      : PipelineStage(cfg, std::move(chunks)), f_(f) {}
  // A chunk is 1/v of the stage: it computes for 1/v of the time.
  Tensor forward(const Tensor& input, int chunk = 0) override {
    return simulated_compute(PipelineStage::forward(input, chunk), f_ / num_chunks());
  }

 private:
  std::chrono::microseconds f_;
};

}  // namespace loom::bench
