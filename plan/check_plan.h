// What loom_plan refuses before it plans: the same rules train_gpt checks
// before it trains (train/args.cpp, validate), so that a plan is
// never printed for a run that could not start - NaN from --dp 0, an MFU
// above 100% from --efficiency 2, a width the heads do not divide.
#pragma once

#include "plan/config.h"

namespace loom::plan {

// Throws loom::Error naming the flag, its value and the rule it breaks.
void check_plan(const ModelShape& m, const Grid& g, const Batch& b);

// --efficiency: a fraction of the peak, in (0, 1]; 0 means "the machine's own".
void check_efficiency(double efficiency);

}  // namespace loom::plan
