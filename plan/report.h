// loom_plan's printout: the plan of one step as a table a learner can check
// by hand, each line with the formula it came from.
#pragma once

#include <string>

#include "plan/step_time.h"

namespace loom::plan {

// train_tokens > 0: also the time to train on that many tokens, and the device-hours.
std::string report(const ModelShape& m, const Grid& g, const Batch& b, const Machine& mc, const StepPlan& s,
                   double train_tokens = 0);

// Parameters of the whole model (tp 1, pp 1; the tied embedding counted once).
int64_t total_params(const ModelShape& m);

}  // namespace loom::plan
