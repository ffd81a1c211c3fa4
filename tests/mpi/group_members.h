// The global ranks of a process group's members, in group-rank order, as the
// group itself reports them (one all-gather): what the mpi grid tests compare
// with ProcessGrid's rank lists.
#pragma once

#include <vector>

#include "parallel/process_group_manager.h"

namespace loom::parallel {

using Ranks = std::vector<int>;

inline Ranks members(ProcessGroup& group) {
  Tensor mine = from_vector<int32_t>({world().rank()});
  Tensor all = zeros({group.size()}, kInt32);
  group.all_gather(all, mine);
  std::vector<int32_t> v = all.to_vector<int32_t>();
  return Ranks(v.begin(), v.end());
}

}  // namespace loom::parallel
