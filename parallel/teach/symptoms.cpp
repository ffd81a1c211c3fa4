#include "parallel/teach/symptoms.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "parallel/teach/teach_break.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::teach {

namespace {

double g_max_moved = 0;  // drop_correction's largest m' - m since the last symptom line

// max over params of max |p - p on dp rank 0|, the same on every rank of dp.
double dp_replica_distance(nn::Module& net, parallel::ProcessGroup& dp) {
  double worst = 0;
  for (const Tensor& p : net.parameters()) {
    Tensor rank0 = ops::clone(p);
    dp.broadcast(rank0, /*root=*/0);
    const std::vector<double> a = p.to_vector<double>(), b = rank0.to_vector<double>();
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  }
  Tensor w = full({1}, worst, kFloat64);
  dp.all_reduce(w, parallel::ReduceOp::Max);
  return w.item<double>();
}

// || wte of the first stage - the last stage's copy ||, on every rank of the
// embedding group (0 on middle stages and without a pipeline).
double tied_copies_distance(parallel::Model& m, parallel::ProcessGroupManager& pgm) {
  if (!pgm.in_embedding_group() || pgm.embedding_group().size() == 1) return 0;
  parallel::ProcessGroup& group = pgm.embedding_group();
  const Tensor mine = m.chunks->embedding_weight();
  if (!mine.defined()) return 0;  // untied: no copies
  Tensor first = ops::clone(mine);
  group.broadcast(first, /*root=*/0);  // group rank 0: the first stage
  double sum = 0;
  const std::vector<double> a = mine.to_vector<double>(), b = first.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) sum += (a[i] - b[i]) * (a[i] - b[i]);
  Tensor d = full({1}, std::sqrt(sum), kFloat64);
  group.all_reduce(d, parallel::ReduceOp::Max);
  return d.item<double>();
}

}  // namespace

Tensor drop_correction(const Tensor& m, const Tensor& m_new) {
  const std::vector<double> old_max = m.to_vector<double>(), new_max = m_new.to_vector<double>();
  for (size_t i = 0; i < old_max.size(); ++i) g_max_moved = std::max(g_max_moved, new_max[i] - old_max[i]);
  return ones(m.shape(), m.dtype(), m.device());
}

std::string symptom(int64_t step, double grad_norm, parallel::Model& m, parallel::ProcessGroupManager& pgm) {
  NoGradGuard no_grad;
  char line[256] = "";
  if (broken(Break::DpAllReduceParam) || broken(Break::ZbSyncAtB)) {
    const double d = dp_replica_distance(*m.chunks, pgm.dp_group());
    std::snprintf(line, sizeof line,
                  "teach-break %s: step %lld: the dp replicas differ by max |param - rank 0's| = %.3e"
                  " (0 when the gradients are averaged)\n",
                  broken(Break::ZbSyncAtB) ? "zb-sync-at-b" : "dp-allreduce-param", (long long)step + 1, d);
  } else if (broken(Break::SkipTiedSync)) {
    const double d = tied_copies_distance(m, pgm);
    std::snprintf(line, sizeof line,
                  "teach-break skip-tied-sync: step %lld: ||wte(first stage) - wte(last stage's copy)|| = %.3e"
                  " (0 when the embedding group sums their gradients)\n",
                  (long long)step + 1, d);
  } else if (broken(Break::DpDivideTwice)) {
    // The bug scales every gradient by 1/dp, so the true norm is dp times the logged one.
    std::snprintf(line, sizeof line,
                  "teach-break dp-divide-twice: step %lld: grad norm %.4g, the true one %.4g (%d x): AdamW cancels a "
                  "factor that is the same every step, but clipping rescales some steps and not others\n",
                  (long long)step + 1, grad_norm, grad_norm * pgm.dp_size, pgm.dp_size);
  } else if (broken(Break::RingNoMaxCorrection)) {
    Tensor moved = full({1}, g_max_moved, kFloat64);
    pgm.world().all_reduce(moved, parallel::ReduceOp::Max);
    g_max_moved = 0;
    const double d = moved.item<double>();
    std::snprintf(line, sizeof line,
                  "teach-break ring-no-max-correction: step %lld: the running max moved by up to %.3f between "
                  "blocks: what was summed under the older max weighs e^%.3f = %.4g times too much\n",
                  (long long)step + 1, d, d, std::exp(d));
  }
  return pgm.global_rank == 0 ? std::string(line) : std::string();
}

}  // namespace loom::teach
