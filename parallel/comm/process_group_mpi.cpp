#include "parallel/comm/process_group_mpi.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <mutex>
#include <set>

#include "parallel/comm/mpi_checks.h"
#include "tensor/cuda/cuda.h"
#include "tensor/ops.h"

namespace loom::parallel {

void mpi_check(int code, const char* call, const char* file, int line) {
  if (code == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, msg, &len);
  throw Error(str(call, " failed at ", file, ":", line, ": ", std::string(msg, size_t(len))));
}

// How a dtype travels. Half types move as raw 16-bit words; reductions convert
// them to fp32 first (see the header).
MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::Float64: return MPI_DOUBLE;
    case DType::Float32: return MPI_FLOAT;
    case DType::BFloat16:
    case DType::Float16: return MPI_UINT16_T;
    case DType::Int32: return MPI_INT32_T;
    case DType::Int64: return MPI_INT64_T;
  }
  throw Error("mpi_type: unknown dtype");
}

void check_tensor(const char* op, const Tensor& t, const char* what) {
  LOOM_CHECK(t.defined(), op, ": ", what, " is undefined");
  LOOM_CHECK(t.device().is_cpu() || t.device().is_cuda(), op, ": the MPI backend takes CPU or CUDA tensors, got ",
             what, " ", t.describe(), " on ", t.device().str());
  LOOM_CHECK(t.is_contiguous(), op, ": ", what, " ", t.describe(), " must be contiguous (call contiguous() first)");
  LOOM_CHECK(t.numel() <= INT_MAX, op, ": ", what, " has ", t.numel(), " elements; MPI counts stop at 2^31 - 1");
}

HostStaging::HostStaging(const Tensor& t, bool fetch) : device_(t) {
  if (t.device().is_cpu()) host_ = t;
  else if (!fetch) host_ = empty(t.shape(), t.dtype());
  else {
    cuda::DeferIndexErrors defer;  // a kernel's bad index is the compute thread's to report, not this collective's
    host_ = ops::to(t, kCPU);
  }
}

void HostStaging::put_back() const {
  if (!host_.is_same(device_)) ops::copy_(device_, host_);
}

// Tags: MPI guarantees at least 0..32767.
void check_peer(const char* op, int peer, int rank, int size, int tag, const std::string& name) {
  LOOM_CHECK(peer >= 0 && peer < size, op, ": rank ", peer, " is not in group ", name, " (size ", size, ")");
  LOOM_CHECK(peer != rank, op, ": rank ", rank, " cannot ", op, " to/from itself (the group's operations run one at "
             "a time, so it would wait for itself)");
  LOOM_CHECK(tag >= 0 && tag <= 32767, op, ": tag ", tag, " is outside 0..32767");
}

namespace {

// Live groups, so that finalize() can stop their threads before MPI_Finalize.
std::mutex g_groups_mutex;
std::set<MpiProcessGroup*> g_groups;

// Avg is a Sum followed by a division on this rank.
MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Max ? MPI_MAX : MPI_SUM; }

// The buffer a reduction runs on: t itself, or an fp32 copy for bf16/fp16.
Tensor reduction_buffer(const Tensor& t) { return is_half(t.dtype()) ? ops::to(t, kFloat32) : t; }

// t /= n for ReduceOp::Avg (t is fp32 or fp64 here). A division rather than a
// multiplication by 1/n: x / 3 is correctly rounded, x * (1/3) is not.
void divide_(const Tensor& t, int n) {
  int64_t count = t.numel();
  if (t.dtype() == kFloat64) {
    double* p = t.data<double>();
    for (int64_t i = 0; i < count; ++i) p[i] /= double(n);
  } else {
    float* p = t.data<float>();
    for (int64_t i = 0; i < count; ++i) p[i] /= float(n);
  }
}

// A group of one rank: every collective is the identity (a sum, max or mean
// over one rank is its value, x / 1 exactly), so it moves no data: output
// gets input's values unless it already is that memory. Saves a single-GPU
// run (dp = 1, which bf16 and --zero still run through the bucket buffer) two
// copies of the whole gradient buffer through the host every step.
void identity_(const Tensor& output, const Tensor& input) {
  if (output.storage() == input.storage() && output.raw_data() == input.raw_data()) return;
  ops::copy_(output, input);
}

}  // namespace

MpiProcessGroup::MpiProcessGroup(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
  mpiCheck(MPI_Comm_rank(comm_, &rank_));
  mpiCheck(MPI_Comm_size(comm_, &size_));
  MPI_Comm_set_name(comm_, name_.c_str());  // shows in MPI's own error messages
  queue_ = std::make_unique<CommQueue>(str(name_, " (size ", size_, ")"));
  std::lock_guard<std::mutex> lock(g_groups_mutex);
  g_groups.insert(this);
}

MpiProcessGroup::~MpiProcessGroup() { shutdown(); }

void MpiProcessGroup::shutdown() {
  {
    std::lock_guard<std::mutex> lock(g_groups_mutex);
    g_groups.erase(this);
  }
  queue_->shutdown();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
  comm_ = MPI_COMM_NULL;
}

void shutdown_all_mpi_groups() {
  std::set<MpiProcessGroup*> groups;
  {
    std::lock_guard<std::mutex> lock(g_groups_mutex);
    groups = g_groups;
  }
  for (MpiProcessGroup* g : groups) g->shutdown();
}

// ---- waiting without hogging a core -----------------------------------------------
// MPI waits by busy-polling. A collective launched early - a gradient bucket
// during backward - would spin while its peers are still computing, taking a
// core from this rank's compute thread whenever the machine has no idle one
// (2 ranks on 2 cores). So every collective first waits politely for all ranks
// to arrive: an MPI_Ibarrier, tested with naps in between. Only then does it
// run the blocking collective (MPI's fastest algorithms), which spins just
// while data moves. Once some thread waits on the group (a synchronous call,
// or the end of backward) its core is idle anyway, and we poll flat out.

void MpiProcessGroup::progress(MPI_Request& request, MPI_Status* status) {
  auto nap = std::chrono::microseconds(20);
  for (;;) {
    int done = 0;
    mpiCheck(MPI_Test(&request, &done, status));
    if (done) return;
    if (queue_->awaited()) continue;
    queue_->nap(nap);
    nap = std::min(2 * nap, std::chrono::microseconds(200));
  }
}

// ---- arriving: every rank agrees on what runs next -------------------------------
// Every rank calls arrive() before every collective (whether or not anyone
// waits here: the sequence of collectives must be the same on all ranks): a
// small non-blocking all-reduce of what it is about to run (agreement.h), so
// ranks that disagree get an error on every rank instead of MPI reading past
// one rank's buffer. It costs what a barrier costs: one exchange of 32 bytes.

void MpiProcessGroup::arrive(Collective kind, int64_t count, DType dtype, ReduceOp op) {
  if (size_ == 1) return;
  CallAgreement call(kind, op, dtype, count, rank_);
  int reduced[8];
  MPI_Request request;
  mpiCheck(MPI_Iallreduce(call.pairs, reduced, 4, MPI_2INT, MPI_MAXLOC, comm_, &request));
  progress(request);
  call.check(reduced, name_, size_);
}

// ---- collectives: checked here, on the caller's thread; run on the queue -------

std::shared_ptr<Work> MpiProcessGroup::all_reduce_async(const Tensor& t, ReduceOp op) {
  check_tensor("all_reduce", t, "tensor");
  check_reduce_op("all_reduce", t, op);
  return queue_->submit(str("all_reduce(", reduce_op_name(op), ", ", dtype_name(t.dtype()), ")"), t.nbytes(),
                        [this, t, op] {
    if (size_ == 1) return;
    HostStaging staged(t, /*fetch=*/true);
    const Tensor& host = staged.host();
    Tensor buf = reduction_buffer(host);
    arrive(Collective::AllReduce, t.numel(), t.dtype(), op);
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, buf.raw_data(), int(buf.numel()), mpi_type(buf.dtype()), mpi_op(op), comm_));
    if (op == ReduceOp::Avg) divide_(buf, size_);
    if (!buf.is_same(host)) ops::copy_(host, buf);
    staged.put_back();
  });
}

std::shared_ptr<Work> MpiProcessGroup::reduce_scatter_async(const Tensor& output, const Tensor& input, ReduceOp op) {
  check_tensor("reduce_scatter", output, "output");
  check_tensor("reduce_scatter", input, "input");
  check_reduce_op("reduce_scatter", input, op);
  check_reduce_scatter_shapes(output, input, size_);
  return queue_->submit(str("reduce_scatter(", reduce_op_name(op), ", ", dtype_name(input.dtype()), ")"),
                        input.nbytes(), [this, output, input, op] {
    if (size_ == 1) return identity_(output, input);
    HostStaging staged_in(input, /*fetch=*/true), staged_out(output, /*fetch=*/false);
    const Tensor &input_h = staged_in.host(), &output_h = staged_out.host();
    Tensor in = reduction_buffer(input_h);
    // A separate result buffer when the output is a view into the input (ZeRO
    // reduce-scatters a bucket into this rank's shard of it): MPI forbids aliasing.
    bool direct = in.dtype() == output_h.dtype() && !overlap(output_h, input_h);
    Tensor out = direct ? output_h : empty(output_h.shape(), in.dtype());
    arrive(Collective::ReduceScatter, input.numel(), input.dtype(), op);
    mpiCheck(MPI_Reduce_scatter_block(in.raw_data(), out.raw_data(), int(out.numel()), mpi_type(in.dtype()),
                                      mpi_op(op), comm_));
    if (op == ReduceOp::Avg) divide_(out, size_);
    if (!direct) ops::copy_(output_h, out);
    staged_out.put_back();
  });
}

std::shared_ptr<Work> MpiProcessGroup::all_gather_async(const Tensor& output, const Tensor& input) {
  check_tensor("all_gather", output, "output");
  check_tensor("all_gather", input, "input");
  check_all_gather_shapes(output, input, size_);
  return queue_->submit(str("all_gather(", dtype_name(input.dtype()), ")"), output.nbytes(), [this, output, input] {
    if (size_ == 1) return identity_(output, input);
    int n = int(input.numel());
    MPI_Datatype type = mpi_type(input.dtype());
    auto* own_block = static_cast<char*>(output.raw_data()) + size_t(rank_) * input.nbytes();
    // In place: the input already sits at this rank's block of the output
    // (ZeRO all-gathers updated shards straight into the parameter buffer).
    const bool in_place = input.raw_data() == own_block;
    HostStaging staged_out(output, /*fetch=*/in_place);
    const Tensor& output_h = staged_out.host();
    arrive(Collective::AllGather, input.numel(), input.dtype());
    if (in_place) {
      mpiCheck(MPI_Allgather(MPI_IN_PLACE, n, type, output_h.raw_data(), n, type, comm_));
    } else {
      HostStaging staged_in(input, /*fetch=*/true);
      Tensor in = overlap(output_h, staged_in.host()) ? ops::clone(staged_in.host()) : staged_in.host();
      mpiCheck(MPI_Allgather(in.raw_data(), n, type, output_h.raw_data(), n, type, comm_));
    }
    staged_out.put_back();
  });
}

std::shared_ptr<Work> MpiProcessGroup::broadcast_async(const Tensor& t, int root) {
  check_tensor("broadcast", t, "tensor");
  LOOM_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of group ", name_, " (size ", size_,
             ")");
  return queue_->submit(str("broadcast(root ", root, ", ", dtype_name(t.dtype()), ")"), t.nbytes(), [this, t, root] {
    if (size_ == 1) return;
    HostStaging staged(t, /*fetch=*/rank_ == root);
    arrive(Collective::Broadcast, t.numel(), t.dtype());
    mpiCheck(MPI_Bcast(staged.host().raw_data(), int(t.numel()), mpi_type(t.dtype()), root, comm_));
    if (rank_ != root) staged.put_back();
  });
}

std::shared_ptr<Work> MpiProcessGroup::send_async(const Tensor& t, int dst, int tag) {
  check_tensor("send", t, "tensor");
  check_peer("send", dst, rank_, size_, tag, name_);
  return queue_->submit(str("send(to ", dst, ", tag ", tag, ")"), t.nbytes(), [this, t, dst, tag] {
    HostStaging staged(t, /*fetch=*/true);
    MPI_Request request;
    mpiCheck(MPI_Isend(staged.host().raw_data(), int(t.numel()), mpi_type(t.dtype()), dst, tag, comm_, &request));
    progress(request);
  });
}

std::shared_ptr<Work> MpiProcessGroup::recv_async(const Tensor& t, int src, int tag) {
  check_tensor("recv", t, "tensor");
  check_peer("recv", src, rank_, size_, tag, name_);
  return queue_->submit(str("recv(from ", src, ", tag ", tag, ")"), t.nbytes(), [this, t, src, tag] {
    HostStaging staged(t, /*fetch=*/false);
    MPI_Status status;
    MPI_Datatype type = mpi_type(t.dtype());
    MPI_Request request;
    mpiCheck(MPI_Irecv(staged.host().raw_data(), int(t.numel()), type, src, tag, comm_, &request));
    progress(request, &status);
    int count = 0;
    mpiCheck(MPI_Get_count(&status, type, &count));
    LOOM_CHECK(count == t.numel(), "recv: expected ", t.numel(), " elements (", t.describe(), ") from rank ", src,
               " but the message holds ", count);
    staged.put_back();
  });
}

std::shared_ptr<Work> MpiProcessGroup::barrier_async() {
  return queue_->submit("barrier", 0, [this] { arrive(Collective::Barrier, 0, kFloat32); });
}

std::unique_ptr<ProcessGroup> MpiProcessGroup::split(int color, int key, const std::string& name) {
  MPI_Comm newcomm = MPI_COMM_NULL;
  // On the queue: MPI_Comm_split is a collective on this communicator, and a
  // communicator's collectives must not run on two threads at once.
  queue_->submit("split", 0, [&] {
    mpiCheck(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &newcomm));
  })->wait();
  if (newcomm == MPI_COMM_NULL) return nullptr;
  return std::make_unique<MpiProcessGroup>(newcomm, name);
}

}  // namespace loom::parallel
