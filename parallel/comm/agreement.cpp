#include "parallel/comm/agreement.h"

#include "tensor/error.h"

namespace loom::parallel {

namespace {

// What a rank is about to run, packed into one int: kind, reduce op, dtype.
int signature(Collective kind, ReduceOp op, DType dtype) { return (int(kind) * 4 + int(op)) * 16 + int(dtype); }

const char* collective_name(Collective kind) {
  switch (kind) {
    case Collective::AllReduce: return "all_reduce";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::AllGather: return "all_gather";
    case Collective::Broadcast: return "broadcast";
    case Collective::Barrier: return "barrier";
    case Collective::AllToAll: return "all_to_all_v";
  }
  return "?";
}

// "all_reduce(sum, float32)", from a signature.
std::string describe_call(int sig) {
  auto kind = Collective(sig / 64);
  auto op = ReduceOp(sig / 16 % 4);
  auto dtype = DType(sig % 16);
  if (kind == Collective::Barrier) return "barrier";
  if (kind == Collective::AllReduce || kind == Collective::ReduceScatter)
    return str(collective_name(kind), "(", reduce_op_name(op), ", ", dtype_name(dtype), ")");
  return str(collective_name(kind), "(", dtype_name(dtype), ")");
}

}  // namespace

CallAgreement::CallAgreement(Collective kind, ReduceOp op, DType dtype, int64_t count, int rank) {
  const int sig = signature(kind, op, dtype), n = int(count);
  const int p[8] = {sig, rank, -sig, rank, n, rank, -n, rank};
  for (int i = 0; i < 8; ++i) pairs[i] = p[i];
}

void CallAgreement::check(const int r[8], const std::string& group, int group_size) const {
  const int sig = pairs[0], n = pairs[4], rank = pairs[1];
  const int sig_max = r[0], sig_min = -r[2], n_max = r[4], n_min = -r[6];
  if (sig_max == sig && sig_min == sig && n_max == n && n_min == n) return;
  std::string here = str("ranks disagree on group ", group, " (size ", group_size, "): rank ", rank, " is in ",
                         describe_call(sig));
  const char* why = " (every rank must run the same collectives, on the same dtypes and element counts, in the "
                    "same order)";
  if (sig_max != sig || sig_min != sig) {
    bool max = sig_max != sig;
    throw Error(str(here, " but rank ", r[max ? 1 : 3], " is in ", describe_call(max ? sig_max : sig_min), why));
  }
  bool max = n_max != n;
  throw Error(str(here, " of ", n, " elements but rank ", r[max ? 5 : 7], " passes ", max ? n_max : n_min,
                  " elements", why));
}

}  // namespace loom::parallel
