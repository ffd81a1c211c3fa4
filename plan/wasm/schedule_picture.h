// The pipeline schedule of a plan, drawn with loom's own schedule picture
// (parallel/trace/schedule_svg.h) - the one train_gpt --schedule-svg draws from
// a run - here from the planner's numbers instead of a run's clock: each
// stage runs its forwards and backwards in its schedule's order, each as long
// as the plan says (StagePlan::micro_batch_s, split as forward : backward),
// and each starts when its stage is free and its input is ready
// (without_transfers, schedule_diagram.h). For the page, docs/site/planner.md.
#pragma once

#include <string>

#include "plan/step_time.h"

namespace loom::plan {

// The SVG, or "" when there is nothing to draw (pp 1: no pipeline) or a
// schedule it does not know the order of.
std::string schedule_picture(const Grid& g, const Batch& b, const StepPlan& s);

}  // namespace loom::plan
