#include "train/guards.h"

#include <cmath>
#include <limits>
#include <sstream>

#include "parallel/comm/build_info.h"
#include "parallel/comm/distributed.h"
#include "parallel/comm/handshake.h"
#include "parallel/teach/teach_break.h"
#include "tensor/ops.h"

namespace loom::train {

void check_ranks_agree_on_flags(const std::string& flags) {
  // CLI11's dump of every option, one "name=value" per line: every rank must have been started with the same.
  parallel::RunFields fields;
  std::stringstream lines(flags);
  for (std::string line; std::getline(lines, line);) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string value = line.substr(eq + 1);
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
    fields.emplace_back(line.substr(0, eq), value);
  }
  parallel::check_ranks_agree(parallel::world(), fields, "flags");
  parallel::check_ranks_agree(parallel::world(), parallel::build_fields(), "build",  // parallel/comm/build_info.h
                              "every rank must run the same build of train_gpt, with the same LOOM_* kernels");
}

void check_ranks_agree_on_skip(int64_t step, const optim::StepResult& s, const optim::MixedPrecisionOptimizer& opt,
                               parallel::ProcessGroupManager& pgm) {
  if (!opt.scaler() || pgm.world().size() == 1) return;  // only fp16's loss scaler skips steps
  parallel::check_ranks_agree(pgm.world(), {{str("step ", step + 1, " skipped for overflow"), s.skipped ? "yes" : "no"}},
                              "decision whether to skip the step",
                              teach::broken(teach::Break::FoundInfWrongGroup)
                                  ? "--teach-break found-inf-wrong-group reduced found_inf over the dp group, so "
                                    "each pipeline stage decided alone"
                                  : "found_inf must be reduced over every rank holding part of the model, or the "
                                    "stages step different models");
}

void stop_if_diverged(int64_t step, double loss, const optim::StepResult& s) {
  // An fp16 step skipped for overflow is the loss scaler's business (it backs
  // off, and stops the run at its floor); anything else non-finite is divergence.
  if (s.skipped) return;
  LOOM_CHECK(std::isfinite(loss) && std::isfinite(s.grad_norm), "step ", step + 1,
             ": the training diverged (loss ", loss, ", grad norm ", s.grad_norm,
             "); stopping without saving, so the last checkpoint keeps finite weights (a too-high --lr?)");
}

void inject_overflow(const parallel::DataParallelWrap& dp, parallel::ProcessGroupManager& pgm) {
  // Rank 0 and, under HSDP, its replicas: the inf is put into the reduced
  // grad shard, past the all-reduce over the replicas that would have carried it.
  if (pgm.tp_rank || pgm.cp_rank || pgm.pp_rank || pgm.dp_rank % pgm.dp_shard_size) return;
  // The gradient sync carries the inf only as far as its bucket's reduction
  // does (an all-reduce: the dp group; a ZeRO reduce-scatter: the element's
  // owner alone; never to other pipeline stages); found_inf's all-reduce must
  // make every rank skip. The last param, not the first: that is the tied
  // embedding, whose gradient the shared-weight handler would also carry to
  // the last stage.
  ops::fill_(dp.last_grad_element(), std::numeric_limits<double>::infinity());
}

}  // namespace loom::train
