// Break it on purpose: train_gpt --teach-break NAME reproduces a classic bug of
// distributed training, so that a learner sees what goes wrong and how it shows.
// Each bug is one `if (teach::broken(...))` beside the correct line it replaces,
// so reading the right code also shows the wrong one. With no --teach-break
// (the default, Break::None) no branch is taken and no number changes.
//
//   dp-allreduce-param    DataParallelNaive's hook all-reduces the parameter
//                         instead of its gradient (picotron issue #39): the
//                         replicas step on their own gradients and drift apart
//   dp-divide-twice       each bucket is divided by dp before its averaging
//                         all-reduce: gradients 1/dp too small. AdamW would
//                         cancel a factor that is the same every step, but
//                         clipping rescales some steps and not others, so the
//                         loss drifts; the logged grad norm is 1/dp of the true one
//   skip-tied-sync        the tied embedding's gradient is not summed over the
//                         embedding group: the first stage's wte and the last
//                         stage's copy drift apart (train_gpt prints the distance)
//   found-inf-wrong-group found_inf and the grad norm reduced over the dp group
//                         instead of the model-parallel group: under fp16, stages
//                         disagree on skipping a step (detected, reported, stopped)
//   recompute-fresh-dropout  --recompute's rerun draws the next call's dropout
//                         masks, not the forward's: backward differentiates a
//                         network the forward never ran. Silent: the loss still
//                         falls. Only the run without the bug shows it (measured,
//                         --layers 2 --embd 32 --batch 4 --dropout 0.2 --recompute
//                         full): step 1's grad norm 2.135 instead of 2.050, the
//                         loss off from step 2 on, 2.786 instead of 2.771 at step 30
//   zero3-free-before-backward  ZeRO-3 does not gather a unit again before its
//                         backward: the params it freed after forward are read
//                         by its backward, and the run stops at the first read
//                         ("data: the storage of [...] was released")
//   ring-no-max-correction  ring attention (--cp) merges a block's partial softmax
//                         without rescaling what was summed under the old running
//                         max (the e^(m - m') factor): earlier blocks weigh too much.
//                         Invisible at step 1 (every score ~0, every block's max
//                         alike), it grows as attention sharpens, and the run falls
//                         behind one process's: train_gpt prints how far the running
//                         max moved, e^that the factor dropped (symptoms.h)
//   tp-kv-rows-of-rank-0  tensor parallelism gives every tp rank the k and v rows
//                         of rank 0's kv heads, as if kv heads were replicated
//                         over tp: rank r's query heads read another group's keys.
//                         Nothing crashes and the loss falls; step 1's loss is
//                         already not one process's (chapter 15)
//   zb-sync-at-b          --schedule zb-h1 syncs data parallelism as 1F1B does, with
//                         the last backward's input half (B), not with its W: but the
//                         gradient hooks fire in W, all of which now run in no_sync.
//                         --dp-mode naive reduces nothing: each replica steps on its
//                         own gradient and they drift apart (train_gpt prints how
//                         far, as for dp-allreduce-param). --dp-mode bucket hides
//                         it: its finish step launches every bucket no hook
//                         launched, so the numbers stay right and only the
//                         overlap with the cool-down is lost
//   moe-aux-unscaled      the router's aux losses (--experts) are not divided by the
//                         micro-batch count as the main loss is (nn/moe_aux_loss.h):
//                         with --grad-accum m each micro-batch's balancing gradient
//                         counts m times, so the balance pulls m times harder than
//                         with the same tokens in one micro-batch. Nothing fails; step
//                         1's gradient is no longer one micro-batch's (chapter 19)
#pragma once

#include <string>

namespace loom::teach {

enum class Break { None, DpAllReduceParam, DpDivideTwice, SkipTiedSync, FoundInfWrongGroup, RecomputeFreshDropout,
                   Zero3FreeBeforeBackward, RingNoMaxCorrection, TpKvRowsOfRankZero,
                   ZbSyncAtB, MoeAuxUnscaled };

// "none" | "dp-allreduce-param" | ...; an unknown name is an error listing the names.
Break parse_break(const std::string& name);
const char* break_name(Break b);

void set_break(Break b);     // once, at start-up (train_gpt); process-wide
bool broken(Break b);        // is this bug switched on?

}  // namespace loom::teach
