// ProcessGroup: a set of ranks and the collectives they run together on
// tensors (torch.distributed's ProcessGroup, picotron's dist.* calls). This is
// the whole interface the rest of loom sees; the MPI backend (CPU tensors, one
// communication thread per group) and a later NCCL backend (CUDA tensors, one
// stream per group) implement it.
//
// Every operation exists in two forms:
//   all_reduce_async(t, op) -> std::shared_ptr<Work>   queued, returns at once
//   all_reduce(t, op)                                   = all_reduce_async(t, op)->wait()
// A group runs its operations one at a time in the order they were issued
// (FIFO, like a CUDA stream), so every rank must issue the same operations on
// a group in the same order - the contract of MPI and NCCL alike. Until an
// async operation's Work is completed its tensors belong to the group: do not
// read or write them.
//
// Tensors are CPU (MPI) or CUDA (NCCL), contiguous, of any dtype; the checks
// run on the calling thread before anything is queued, so a bad call throws
// loom::Error on every rank before any communication starts.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace loom::parallel {

enum class ReduceOp { Sum, Avg, Max };  // Avg: floating dtypes only
const char* reduce_op_name(ReduceOp op);

// A handle on a queued operation (torch.distributed's Work). On the CPU
// backend wait() blocks the calling thread; a CUDA backend's wait() will make
// the caller's stream wait for the group's stream instead, as NCCL's does.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation has finished; rethrows its error, if any.
  virtual void wait() = 0;
  // True once the operation has finished (successfully or not). Never blocks.
  virtual bool is_completed() = 0;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;                  // this process's rank in the group, 0..size-1
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;   // "world", "dp", "pp", ... (for messages)

  // ---- asynchronous: queued on the group's communication thread/stream ----
  // t (in place) = op over all ranks of t.
  virtual std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op = ReduceOp::Sum) = 0;
  // input: [size * n] elements -> output: [n], this rank's block of the reduced input.
  // input.numel() must be exactly size * output.numel() (callers pad; see bucket.h).
  virtual std::shared_ptr<Work> reduce_scatter_async(const Tensor& output, const Tensor& input,
                                                     ReduceOp op = ReduceOp::Sum) = 0;
  // input: [n] on every rank -> output: [size * n], rank r's input at block r.
  virtual std::shared_ptr<Work> all_gather_async(const Tensor& output, const Tensor& input) = 0;
  // t (in place) = t of rank `root` on every rank.
  virtual std::shared_ptr<Work> broadcast_async(const Tensor& t, int root) = 0;
  // Point to point: t goes to rank dst, matched by (source, tag) on the other
  // side. Like everything else they run in FIFO order on the group, so two
  // ranks exchanging tensors must order their calls so that each send meets a
  // posted receive (rank 0: send then recv; rank 1: recv then send).
  virtual std::shared_ptr<Work> send_async(const Tensor& t, int dst, int tag = 0) = 0;
  virtual std::shared_ptr<Work> recv_async(const Tensor& t, int src, int tag = 0) = 0;
  // A send posted now, on the calling thread, instead of behind the group's
  // queue (torch.distributed's isend, MPI_Isend): it returns at once, the
  // message is on its way before the call returns, and the Work completes when
  // the receiver has it. Ordered with the group's other isends to the same
  // rank and tag, not with its queued operations. The default queues it like
  // send_async; the MPI backend overrides it (why: pipeline_channels.h).
  virtual std::shared_ptr<Work> isend(const Tensor& t, int dst, int tag = 0) { return send_async(t, dst, tag); }
  // Its receiving side (torch.distributed's irecv, MPI_Irecv): posted now, on
  // the calling thread; wait() waits there too, with no hand-off to the
  // group's thread. Ordered with the group's other irecvs from the same rank
  // and tag. The default queues it like recv_async.
  virtual std::shared_ptr<Work> irecv(const Tensor& t, int src, int tag = 0) { return recv_async(t, src, tag); }
  virtual std::shared_ptr<Work> barrier_async() = 0;
  // All-to-all with uneven blocks (MPI_Alltoallv; torch.distributed's
  // all_to_all_single with split sizes): input's rows, cut in blocks of
  // input_splits[0], input_splits[1], ... rows, go to ranks 0, 1, ...; output
  // gets rank r's block for this rank at its output_splits[r] rows, in rank order.
  //   input [Σ input_splits, ...] -> output [Σ output_splits, ...], the same row shape and dtype
  // Rows are along dim 0. The splits must match across ranks (this rank's
  // output_splits[r] = rank r's input_splits[this rank]): expert parallelism
  // exchanges them first (parallel/expert_parallel/token_dispatcher_all_to_all.h).
  // Groups that cannot (test doubles) keep the default, which throws.
  virtual std::shared_ptr<Work> all_to_all_v_async(const Tensor& output, const Tensor& input,
                                                   const std::vector<int64_t>& output_splits,
                                                   const std::vector<int64_t>& input_splits);

  // ---- synchronous: the same, then wait ----
  void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum) { all_reduce_async(t, op)->wait(); }
  void reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::Sum) {
    reduce_scatter_async(output, input, op)->wait();
  }
  void all_gather(const Tensor& output, const Tensor& input) { all_gather_async(output, input)->wait(); }
  void broadcast(const Tensor& t, int root) { broadcast_async(t, root)->wait(); }
  void send(const Tensor& t, int dst, int tag = 0) { send_async(t, dst, tag)->wait(); }
  void recv(const Tensor& t, int src, int tag = 0) { recv_async(t, src, tag)->wait(); }
  void barrier() { barrier_async()->wait(); }
  void all_to_all_v(const Tensor& output, const Tensor& input, const std::vector<int64_t>& output_splits,
                    const std::vector<int64_t>& input_splits) {
    all_to_all_v_async(output, input, output_splits, input_splits)->wait();
  }

  // ---- sub-groups ----
  // Collective over this group (every rank must call it, in the same order as
  // its other operations): ranks passing the same color >= 0 form a new group,
  // ordered by key; a rank passing color < 0 gets nullptr. MPI_Comm_split /
  // ncclCommSplit. The new group has its own communication thread/stream.
  virtual std::unique_ptr<ProcessGroup> split(int color, int key, const std::string& name) = 0;
};

// ---- argument checks every backend makes on the caller's thread ----
// (the same message from the MPI and the NCCL backend for the same bad call)
void check_reduce_op(const char* op, const Tensor& t, ReduceOp r);  // Avg: floating dtypes only
// reduce_scatter: input [size * n] -> output [n], one dtype.
void check_reduce_scatter_shapes(const Tensor& output, const Tensor& input, int size);
// all_gather: input [n] -> output [size * n], one dtype.
void check_all_gather_shapes(const Tensor& output, const Tensor& input, int size);
// all_to_all_v: one split per rank, each >= 0, summing to the rows of input
// and output; one dtype and one row shape.
void check_all_to_all_shapes(const Tensor& output, const Tensor& input, const std::vector<int64_t>& output_splits,
                             const std::vector<int64_t>& input_splits, int size);
// The two views share bytes (collectives may not alias except in place).
bool overlap(const Tensor& a, const Tensor& b);

}  // namespace loom::parallel
