#include "parallel/tensor_parallel/replicas.h"

#include "parallel/comm/handshake.h"
#include "tensor/ops.h"

namespace loom::parallel {

void check_tp_replicas_identical(const nn::NamedTensors& replicated, ProcessGroup& tp) {
  if (tp.size() == 1) return;
  RunFields fields;
  for (const auto& [name, p] : replicated) {
    Tensor c = ops::contiguous(p);
    fields.emplace_back(name, fingerprint(c.raw_data(), c.nbytes()));
  }
  check_ranks_agree(tp, fields, "tp replicas of the replicated params (they must stay bit-identical)");
}

}  // namespace loom::parallel
