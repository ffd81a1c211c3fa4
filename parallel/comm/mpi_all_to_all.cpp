// MpiProcessGroup::all_to_all_v: MPI_Alltoallv on the group's thread, the rows
// of dim 0 turned into MPI's element counts and displacements. Apart from
// process_group_mpi.cpp because it is one idea: blocks of different sizes to
// every rank at once (expert parallelism's dispatch and combine).
#include <climits>

#include "parallel/comm/mpi_checks.h"
#include "parallel/comm/process_group_mpi.h"
#include "tensor/ops.h"

namespace loom::parallel {

namespace {

// Rows -> MPI's (counts, displacements) in elements of row_numel each.
void counts_and_displacements(const std::vector<int64_t>& rows, int64_t row_numel, std::vector<int>& counts,
                              std::vector<int>& displs) {
  int64_t offset = 0;
  for (int64_t r : rows) {
    LOOM_CHECK(offset + r * row_numel <= INT_MAX, "all_to_all_v: ", offset + r * row_numel,
               " elements; MPI counts stop at 2^31 - 1");
    counts.push_back(int(r * row_numel));
    displs.push_back(int(offset));
    offset += r * row_numel;
  }
}

}  // namespace

std::shared_ptr<Work> MpiProcessGroup::all_to_all_v_async(const Tensor& output, const Tensor& input,
                                                          const std::vector<int64_t>& output_splits,
                                                          const std::vector<int64_t>& input_splits) {
  check_tensor("all_to_all_v", output, "output");
  check_tensor("all_to_all_v", input, "input");
  check_all_to_all_shapes(output, input, output_splits, input_splits, size_);
  LOOM_CHECK(!overlap(output, input) || output.numel() == 0, "all_to_all_v: output ", output.describe(),
             " and input ", input.describe(), " share memory");
  const Tensor& rows = input.size(0) > 0 ? input : output;  // either tells the row size; both may be empty
  const int64_t row_numel = rows.size(0) > 0 ? rows.numel() / rows.size(0) : 0;
  // The trace's bytes: what this rank hands over (its own block included).
  return queue_->submit(str("all_to_all_v(", dtype_name(input.dtype()), ")"), input.nbytes(),
                        [this, output, input, output_splits, input_splits, row_numel] {
    if (size_ == 1) return ops::copy_(output, input);
    std::vector<int> send_counts, send_displs, recv_counts, recv_displs;
    counts_and_displacements(input_splits, row_numel, send_counts, send_displs);
    counts_and_displacements(output_splits, row_numel, recv_counts, recv_displs);
    HostStaging staged_in(input, /*fetch=*/true), staged_out(output, /*fetch=*/false);
    const MPI_Datatype type = mpi_type(input.dtype());
    arrive(Collective::AllToAll, row_numel, input.dtype());  // the ranks agree on the row size
    mpiCheck(MPI_Alltoallv(staged_in.host().raw_data(), send_counts.data(), send_displs.data(), type,
                           staged_out.host().raw_data(), recv_counts.data(), recv_displs.data(), type, comm_));
    staged_out.put_back();
  });
}

}  // namespace loom::parallel
