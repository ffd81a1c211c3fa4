#include "parallel/expert_parallel/token_dispatcher_all_to_all.h"

#include "autograd/functions.h"
#include "parallel/expert_parallel/all_to_all.h"
#include "parallel/trace/trace.h"
#include "tensor/ops.h"

namespace loom::parallel {

namespace {

// Rows of [n, L] counts summed per row: [N ranks, L local experts] -> rows per rank.
std::vector<int64_t> row_sums(const std::vector<int64_t>& counts, int64_t n, int64_t L) {
  std::vector<int64_t> sums(size_t(n), 0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < L; ++j) sums[size_t(i)] += counts[size_t(i * L + j)];
  return sums;
}

// The received rows come in (source s, local expert j) blocks of received[s L + j] rows;
// regrouped as (j, s) (Megatron's sort_chunks_by_idxs): the received row each regrouped row is.
std::vector<int64_t> sort_by_local_expert(const std::vector<int64_t>& received, int64_t n, int64_t L) {
  std::vector<int64_t> start(received.size(), 0), order;
  for (size_t c = 1; c < received.size(); ++c) start[c] = start[c - 1] + received[c - 1];
  for (int64_t j = 0; j < L; ++j)
    for (int64_t s = 0; s < n; ++s)
      for (int64_t i = 0; i < received[size_t(s * L + j)]; ++i) order.push_back(start[size_t(s * L + j)] + i);
  return order;
}

// The inverse permutation: where each received row went.
std::vector<int64_t> inverse(const std::vector<int64_t>& order) {
  std::vector<int64_t> inv(order.size());
  for (size_t i = 0; i < order.size(); ++i) inv[size_t(order[i])] = int64_t(i);
  return inv;
}

Tensor index(const std::vector<int64_t>& rows, const Device& d) {
  return ops::to(from_vector(rows, {int64_t(rows.size())}), d);
}

// How many rows travel: to each rank, from each rank, and from each (source, local expert).
struct Splits {
  std::vector<int64_t> input;     // [n] rows this rank sends to each rank
  std::vector<int64_t> output;    // [n] rows it receives from each rank
  std::vector<int64_t> received;  // [n, L] rows from source s for local expert j
};

// Each rank sends rank p its tokens_per_expert of p's L experts: an [n, L] int64 all-to-all.
Splits exchange_split_sizes(const std::vector<int64_t>& tokens_per_expert, ProcessGroup& ep, int64_t L) {
  const int64_t n = ep.size();
  Splits s;
  s.input = row_sums(tokens_per_expert, n, L);
  Tensor counts = from_vector(tokens_per_expert, {n, L}), received = empty({n, L}, kInt64);
  const std::vector<int64_t> one_row_each(size_t(n), 1);
  ep.all_to_all_v(received, counts, one_row_each, one_row_each);
  s.received = received.to_vector<int64_t>();
  s.output = row_sums(s.received, n, L);
  return s;
}

}  // namespace

Tensor dispatch_compute_combine(const Tensor& permuted, const std::vector<int64_t>& tokens_per_expert,
                                const std::vector<std::shared_ptr<nn::Expert>>& experts, ProcessGroup& ep) {
  using namespace autograd;
  const int64_t E = int64_t(tokens_per_expert.size()), n = ep.size(), L = int64_t(experts.size());
  LOOM_CHECK(L * n == E, "dispatch_compute_combine: ", L, " local experts x ", n, " ep ranks for ", E,
             " group sizes");
  const Device d = permuted.device();
  // 1. Exchange split sizes.
  const Splits splits = exchange_split_sizes(tokens_per_expert, ep, L);
  // 2. Dispatch: each row to its expert's rank.
  Tensor arrived;  // [R, C], by source rank, then local expert
  {
    trace::CommLabel label("moe dispatch");
    arrived = all_to_all(permuted, ep, splits.output, splits.input);
  }
  // 3. Sort by local expert, compute, unsort. Each local expert runs, on no rows when none came: its
  //    weights then have a gradient every step (0), reached in the same order on every rank holding them.
  const std::vector<int64_t> order = sort_by_local_expert(splits.received, n, L);
  const Tensor grouped = index_select(arrived, 0, index(order, d));  // [R, C], by local expert, then source
  std::vector<int64_t> rows_per_expert(size_t(L), 0);                 // [L]
  for (int64_t s = 0; s < n; ++s)
    for (int64_t j = 0; j < L; ++j) rows_per_expert[size_t(j)] += splits.received[size_t(s * L + j)];
  const Tensor computed = nn::expert_compute(grouped, rows_per_expert, experts);
  const Tensor back = index_select(computed, 0, index(inverse(order), d));  // [R, C], by source again
  // 4. Combine: each row home, to the place unpermute expects it.
  Tensor out;  // [M, C]
  {
    trace::CommLabel label("moe combine");
    out = all_to_all(back, ep, splits.input, splits.output);
  }
  return out;
}

}  // namespace loom::parallel
