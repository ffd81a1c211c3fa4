// What a run prints under --teach-break (teach_break.h):
// the symptom of the bug, measured on the run, next to the value it has when
// the code is right. Collective over the ranks that hold what is compared;
// called on every rank after each step, and a no-op without --teach-break.
//
//   dp-allreduce-param   max |param - dp rank 0's| over every param: the dp
//                        replicas are one model only while this is 0
//   skip-tied-sync       || wte (first stage) - wte (last stage's copy) ||: the
//                        tied embedding is one weight only while this is 0
//   dp-divide-twice      the grad norm, which is 1/dp of the one without the
//                        flag (AdamW's update barely changes, so the loss hides it)
//   ring-no-max-correction  max (m' - m), how far the ring's running max moved
//                        since the last line (every forward ring: training,
//                        recomputation, evaluation): a block summed under the
//                        older max weighs e^(m' - m) times too much (~0 and ~1 at
//                        initialisation, where every score is ~0; it grows as
//                        attention sharpens)
//   found-inf-wrong-group  nothing to print: check_ranks_agree_on_skip stops the
//                        run on the first step the stages disagree on
#pragma once

#include <string>

#include "parallel/model.h"
#include "parallel/process_group_manager.h"

namespace loom::teach {

// The symptom line for this step on world rank 0 ("" elsewhere, and without --teach-break).
std::string symptom(int64_t step, double grad_norm, parallel::Model& m, parallel::ProcessGroupManager& pgm);

// --teach-break ring-no-max-correction's line in OnlineSoftmax::absorb: notes
// the largest move of the running max, max (m_new - m), and returns ones in
// m's shape for the correction e^(m - m_new) (the merge without it).
Tensor drop_correction(const Tensor& m, const Tensor& m_new);

}  // namespace loom::teach
