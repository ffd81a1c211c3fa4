// The MPI backend of ProcessGroup: CPU tensors, one MPI communicator and one
// communication thread (CommQueue) per group, so a group's operations run in
// FIFO order beside the compute thread - the CPU analogue of an NCCL stream.
// Needs MPI_THREAD_MULTIPLE: several groups' threads are inside MPI at once.
// MPI busy-polls while it waits; so that a collective launched early does not
// spin on a core the compute thread needs, each one first waits politely for
// all ranks to arrive (see "waiting without hogging a core" in the .cpp).
//
// dtypes: float64, float32, int32 and int64 travel and reduce natively.
// bfloat16 and float16 travel as raw 16-bit words; to reduce them we convert
// to fp32, reduce in fp32, and round back once (rather than a custom MPI_Op
// that would round at every hop of MPI's reduction tree). That costs twice the
// bytes on the wire and gives the correctly rounded sum of the fp32 values.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "parallel/comm/agreement.h"
#include "parallel/comm/comm_queue.h"
#include "parallel/comm/process_group.h"

namespace loom::parallel {

// mpiCheck(MPI_Allreduce(...)): throws loom::Error naming the call, file, line
// and MPI's message when a call fails (communicators use MPI_ERRORS_RETURN).
#define mpiCheck(call) ::loom::parallel::mpi_check((call), #call, __FILE__, __LINE__)
void mpi_check(int code, const char* call, const char* file, int line);

class MpiProcessGroup final : public ProcessGroup {
 public:
  // Takes ownership of comm (freed by shutdown()).
  MpiProcessGroup(MPI_Comm comm, std::string name);
  ~MpiProcessGroup() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override;
  std::shared_ptr<Work> reduce_scatter_async(const Tensor& output, const Tensor& input, ReduceOp op) override;
  std::shared_ptr<Work> all_gather_async(const Tensor& output, const Tensor& input) override;
  std::shared_ptr<Work> broadcast_async(const Tensor& t, int root) override;
  std::shared_ptr<Work> send_async(const Tensor& t, int dst, int tag) override;
  std::shared_ptr<Work> recv_async(const Tensor& t, int src, int tag) override;
  std::shared_ptr<Work> isend(const Tensor& t, int dst, int tag) override;  // MPI_Isend on the caller's thread
  std::shared_ptr<Work> irecv(const Tensor& t, int src, int tag) override;  // MPI_Irecv on the caller's thread
  std::shared_ptr<Work> barrier_async() override;
  std::shared_ptr<Work> all_to_all_v_async(const Tensor& output, const Tensor& input,
                                           const std::vector<int64_t>& output_splits,
                                           const std::vector<int64_t>& input_splits) override;
  std::unique_ptr<ProcessGroup> split(int color, int key, const std::string& name) override;

  MPI_Comm comm() const { return comm_; }
  // Runs what is queued, joins the thread, frees the communicator. Idempotent.
  void shutdown();

 private:
  // Waits for every rank to arrive at this collective; throws loom::Error on
  // every rank when they are about to run different collectives, dtypes or
  // element counts (count: of the input that must match across ranks).
  void arrive(Collective kind, int64_t count, DType dtype, ReduceOp op = ReduceOp::Sum);
  void progress(MPI_Request& request, MPI_Status* status = MPI_STATUS_IGNORE);

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::string name_;
  std::unique_ptr<CommQueue> queue_;
};

// Shuts down every live MpiProcessGroup (finalize() calls it before MPI_Finalize).
void shutdown_all_mpi_groups();

}  // namespace loom::parallel
