#include "parallel/pipeline_parallel/partition.h"

#include <algorithm>
#include <cstddef>
#include <numeric>

#include "tensor/error.h"

namespace loom::parallel {

namespace {

void check_sizes(const char* op, int64_t num_items, int pp_size, int num_chunks) {
  LOOM_CHECK(pp_size >= 1 && num_chunks >= 1, op, ": pp_size ", pp_size, " and num_chunks ", num_chunks,
             " must be >= 1");
  LOOM_CHECK(num_items >= int64_t(pp_size) * num_chunks, op, ": ", num_items, " layers cannot fill pp_size ",
             pp_size, " x num_chunks ", num_chunks, " = ", int64_t(pp_size) * num_chunks,
             " stages (every stage needs at least one layer)");
}

// Interleaved: virtual stage k = c × pp_size + s is chunk c of stage s (Megatron's
// layout). V: chunk 0 of stage s is part s, chunk 1 part 2 pp_size - 1 - s.
StagePartition deal_out(const std::vector<int64_t>& boundaries, int pp_size, int num_chunks, ChunkLayout layout) {
  LOOM_CHECK(layout != ChunkLayout::V || num_chunks == 2, "partition: the V layout holds 2 chunks per stage, got ",
             num_chunks);
  StagePartition stages(size_t(pp_size), std::vector<LayerRange>(static_cast<size_t>(num_chunks)));
  for (int c = 0; c < num_chunks; ++c)
    for (int s = 0; s < pp_size; ++s) {
      const int k = layout == ChunkLayout::V && c == 1 ? 2 * pp_size - 1 - s : c * pp_size + s;
      stages[size_t(s)][size_t(c)] = {boundaries[size_t(k)], boundaries[size_t(k) + 1]};
    }
  return stages;
}

// How many parts greedy filling makes when no part may weigh more than limit
// (limit >= the heaviest item). Greedy is optimal for this count: taking an item
// into the current part never makes the rest harder to cut.
int64_t parts_needed(const std::vector<int64_t>& w, int64_t limit) {
  int64_t parts = 1, sum = 0;
  for (int64_t x : w) {
    if (sum + x > limit) ++parts, sum = 0;
    sum += x;
  }
  return parts;
}

}  // namespace

ChunkLayout schedule_chunk_layout(const std::string& schedule) {
  return schedule == "zb-v" || schedule == "dualpipev" ? ChunkLayout::V : ChunkLayout::Interleaved;
}

bool schedule_splits_backward(const std::string& schedule) {
  return schedule == "zb-h1" || schedule_chunk_layout(schedule) == ChunkLayout::V;
}

StagePartition partition_uniform(int64_t num_items, int pp_size, int num_chunks, ChunkLayout layout) {
  check_sizes("partition_uniform", num_items, pp_size, num_chunks);
  // n items over k parts: every part gets n / k, and the first n % k parts one
  // more (ColossalAI's and picotron's rule): 7 items over 2 stages -> [4, 3].
  const int64_t parts = int64_t(pp_size) * num_chunks;
  const int64_t base = num_items / parts, extra = num_items % parts;
  std::vector<int64_t> boundaries{0};
  for (int64_t k = 0; k < parts; ++k) boundaries.push_back(boundaries.back() + base + (k < extra ? 1 : 0));
  return deal_out(boundaries, pp_size, num_chunks, layout);
}

std::vector<int64_t> balanced_boundaries(const std::vector<int64_t>& weights, int num_parts) {
  const int64_t n = int64_t(weights.size());
  check_sizes("partition_balanced", n, num_parts, 1);
  for (size_t i = 0; i < weights.size(); ++i)
    LOOM_CHECK(weights[i] >= 0, "partition_balanced: weight of layer ", i, " is negative (", weights[i], ")");

  // 1. Binary search the smallest limit on a part's weight with which greedy
  //    filling needs no more than num_parts parts. It lies in [heaviest, total].
  int64_t lo = *std::max_element(weights.begin(), weights.end());
  int64_t hi = std::accumulate(weights.begin(), weights.end(), int64_t(0));
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (parts_needed(weights, mid) <= num_parts) hi = mid;
    else lo = mid + 1;
  }
  const int64_t limit = lo;

  // 2. Cut greedily under that limit, but never take an item into the current
  //    part if that would leave fewer items than parts still to open: the tail
  //    then gets one item per part, so there are exactly num_parts, none empty.
  std::vector<int64_t> b{0};
  int64_t sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (b.back() != i) {  // the current part already holds something
      int64_t parts_still_to_open = num_parts - int64_t(b.size());
      bool fits = sum + weights[size_t(i)] <= limit;
      bool leaves_enough = n - i - 1 >= parts_still_to_open;
      if (!fits || !leaves_enough) b.push_back(i), sum = 0;
    }
    sum += weights[size_t(i)];
  }
  b.push_back(n);
  LOOM_CHECK(int64_t(b.size()) == num_parts + 1, "partition_balanced: internal error, made ", b.size() - 1,
             " parts instead of ", num_parts);
  return b;
}

StagePartition partition_balanced(const std::vector<int64_t>& weights, int pp_size, int num_chunks,
                                  ChunkLayout layout) {
  check_sizes("partition_balanced", int64_t(weights.size()), pp_size, num_chunks);
  return deal_out(balanced_boundaries(weights, pp_size * num_chunks), pp_size, num_chunks, layout);
}

}  // namespace loom::parallel
