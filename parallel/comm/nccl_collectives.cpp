// NcclProcessGroup's operations: each checked on the caller's thread (a bad
// call fails there, naming the group), then launched on the group's stream
// after loom's stream has reached it (an event), under the watchdog's eye
// (nccl_in_flight.h). The class: nccl_process_group.h.
#ifdef LOOM_WITH_NCCL
#include "parallel/comm/nccl_process_group.h"

namespace loom::parallel::nccl_backend {

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::Float64: return ncclFloat64;
    case DType::Float32: return ncclFloat32;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Float16: return ncclFloat16;
    case DType::Int32: return ncclInt32;
    case DType::Int64: return ncclInt64;
  }
  throw Error("nccl_type: unknown dtype");
}

// Avg is NCCL's own (a sum divided by the group size, NCCL 2.10+).
ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
  }
  throw Error("nccl_op: unknown reduce op");
}

}  // namespace

// ---- one operation: checked on the caller's thread, launched on the group's stream ----

void NcclProcessGroup::check_tensor(const char* op, const Tensor& t, const char* what) const {
  LOOM_CHECK(t.defined(), op, ": ", what, " is undefined");
  LOOM_CHECK(t.device() == device_, op, ": the NCCL backend takes CUDA tensors on ", device_.str(), ", got ", what,
             " ", t.describe(), " on ", t.device().str(), " (group ", name_, ")");
  LOOM_CHECK(t.is_contiguous(), op, ": ", what, " ", t.describe(), " must be contiguous (call contiguous() first)");
}

void NcclProcessGroup::check_peer(const char* op, int peer, int tag) const {
  LOOM_CHECK(peer >= 0 && peer < size_, op, ": rank ", peer, " is not in group ", name_, " (size ", size_, ")");
  LOOM_CHECK(peer != rank_, op, ": rank ", rank_, " cannot ", op, " to/from itself (NCCL would wait for the matching "
             "call, which can only come after this one)");
  LOOM_CHECK(tag >= 0 && tag <= 32767, op, ": tag ", tag, " is outside 0..32767");
}

// launch(comm, stream) makes the NCCL call(s). Before it, the group's stream
// waits for everything enqueued so far on loom's stream (the producer of the
// tensors, e.g. main_grad += grad): an event, not a host wait. After it, the
// Work's event marks the operation's end for Work::wait().
template <class Launch>
std::shared_ptr<Work> NcclProcessGroup::enqueue(const std::string& what, size_t bytes, std::vector<Tensor> tensors,
                                                const Launch& launch) {
  const std::string label = str(what, " on group ", name_);  // in errors and in the trace
  // Made before the lock: dropped on an error, its destructor takes the lock.
  auto work = std::make_shared<NcclWork>(comm_, device_, std::move(tensors), label);
  std::lock_guard<std::mutex> lock(comm_->mutex);
  LOOM_CHECK(comm_->comm, what, ": process group ", name_,
             comm_->aborted ? " was aborted by the collective watchdog" : " has been shut down");
  cuda::DeviceGuard guard(device_);
  CUDA_CHECK(cudaEventRecord(ready_, cuda::stream(device_)));
  CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  in_flight_.begin(stream_, what, bytes);
  trace::GpuSpan traced(label, trace::kGpuComm, device_, stream_);  // --trace on a GPU: the GPU communication track
  try {
    launch(comm_->comm, stream_);
  } catch (...) {
    (void)cudaEventRecord(work->done(), stream_);  // the Work's destructor waits for whatever was enqueued
    try {
      in_flight_.end(stream_);
    } catch (...) {  // the launch's error is the one to report
    }
    throw;
  }
  in_flight_.end(stream_);
  CUDA_CHECK(cudaEventRecord(work->done(), stream_));
  return work;
}

std::shared_ptr<Work> NcclProcessGroup::all_reduce_async(const Tensor& t, ReduceOp op) {
  check_tensor("all_reduce", t, "tensor");
  check_reduce_op("all_reduce", t, op);
  return enqueue(str("all_reduce(", reduce_op_name(op), ", ", dtype_name(t.dtype()), ")"), t.nbytes(), {t},
                 [&](ncclComm_t comm, cudaStream_t s) {
    if (t.numel() == 0) return;
    NCCL_CHECK(ncclAllReduce(t.raw_data(), t.raw_data(), size_t(t.numel()), nccl_type(t.dtype()), nccl_op(op),
                             comm, s));
  });
}

// input: [size * n] -> output: [n]. In place when output is this rank's block
// of input (ZeRO's shard of its bucket); any other overlap goes through a
// separate result buffer, copied into output on the group's stream.
std::shared_ptr<Work> NcclProcessGroup::reduce_scatter_async(const Tensor& output, const Tensor& input, ReduceOp op) {
  check_tensor("reduce_scatter", output, "output");
  check_tensor("reduce_scatter", input, "input");
  check_reduce_op("reduce_scatter", input, op);
  check_reduce_scatter_shapes(output, input, size_);
  const void* own_block = static_cast<const char*>(input.raw_data()) + size_t(rank_) * output.nbytes();
  const bool in_place = output.raw_data() == own_block;
  Tensor result = in_place || !overlap(output, input) ? output : empty(output.shape(), output.dtype(), device_);
  return enqueue(str("reduce_scatter(", reduce_op_name(op), ", ", dtype_name(input.dtype()), ")"), input.nbytes(),
                 {output, input, result}, [&](ncclComm_t comm, cudaStream_t s) {
    if (output.numel() == 0) return;
    NCCL_CHECK(ncclReduceScatter(input.raw_data(), result.raw_data(), size_t(output.numel()),
                                 nccl_type(input.dtype()), nccl_op(op), comm, s));
    if (!result.is_same(output))
      CUDA_CHECK(cudaMemcpyAsync(output.raw_data(), result.raw_data(), output.nbytes(), cudaMemcpyDeviceToDevice, s));
  });
}

// input: [n] -> output: [size * n]. In place when input is this rank's block
// of output (ZeRO's param buffer); any other overlap first copies input aside.
std::shared_ptr<Work> NcclProcessGroup::all_gather_async(const Tensor& output, const Tensor& input) {
  check_tensor("all_gather", output, "output");
  check_tensor("all_gather", input, "input");
  check_all_gather_shapes(output, input, size_);
  const void* own_block = static_cast<const char*>(output.raw_data()) + size_t(rank_) * input.nbytes();
  const bool in_place = input.raw_data() == own_block;
  Tensor source = in_place || !overlap(output, input) ? input : empty(input.shape(), input.dtype(), device_);
  return enqueue(str("all_gather(", dtype_name(input.dtype()), ")"), output.nbytes(), {output, input, source},
                 [&](ncclComm_t comm, cudaStream_t s) {
    if (input.numel() == 0) return;
    if (!source.is_same(input))
      CUDA_CHECK(cudaMemcpyAsync(source.raw_data(), input.raw_data(), input.nbytes(), cudaMemcpyDeviceToDevice, s));
    NCCL_CHECK(ncclAllGather(source.raw_data(), output.raw_data(), size_t(input.numel()), nccl_type(input.dtype()),
                             comm, s));
  });
}

std::shared_ptr<Work> NcclProcessGroup::broadcast_async(const Tensor& t, int root) {
  check_tensor("broadcast", t, "tensor");
  LOOM_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of group ", name_, " (size ", size_,
             ")");
  return enqueue(str("broadcast(root ", root, ", ", dtype_name(t.dtype()), ")"), t.nbytes(), {t},
                 [&](ncclComm_t comm, cudaStream_t s) {
    if (t.numel() == 0) return;
    NCCL_CHECK(ncclBroadcast(t.raw_data(), t.raw_data(), size_t(t.numel()), nccl_type(t.dtype()), root, comm, s));
  });
}

std::shared_ptr<Work> NcclProcessGroup::send_async(const Tensor& t, int dst, int tag) {
  check_tensor("send", t, "tensor");
  check_peer("send", dst, tag);
  return enqueue(str("send(to ", dst, ", tag ", tag, ")"), t.nbytes(), {t}, [&](ncclComm_t comm, cudaStream_t s) {
    if (t.numel() == 0) return;
    NCCL_CHECK(ncclSend(t.raw_data(), size_t(t.numel()), nccl_type(t.dtype()), dst, comm, s));
  });
}

std::shared_ptr<Work> NcclProcessGroup::recv_async(const Tensor& t, int src, int tag) {
  check_tensor("recv", t, "tensor");
  check_peer("recv", src, tag);
  return enqueue(str("recv(from ", src, ", tag ", tag, ")"), t.nbytes(), {t}, [&](ncclComm_t comm, cudaStream_t s) {
    if (t.numel() == 0) return;
    NCCL_CHECK(ncclRecv(t.raw_data(), size_t(t.numel()), nccl_type(t.dtype()), src, comm, s));
  });
}

// Rank r's block goes by ncclSend, rank r's block for us comes by ncclRecv, all
// of them in one NCCL group so that they progress together (and the send to
// this rank itself meets its receive).
std::shared_ptr<Work> NcclProcessGroup::all_to_all_v_async(const Tensor& output, const Tensor& input,
                                                           const std::vector<int64_t>& output_splits,
                                                           const std::vector<int64_t>& input_splits) {
  check_tensor("all_to_all_v", output, "output");
  check_tensor("all_to_all_v", input, "input");
  check_all_to_all_shapes(output, input, output_splits, input_splits, size_);
  const Tensor& rows = input.size(0) > 0 ? input : output;
  const size_t row_bytes = rows.size(0) > 0 ? rows.nbytes() / size_t(rows.size(0)) : 0;
  const size_t row_numel = rows.size(0) > 0 ? size_t(rows.numel() / rows.size(0)) : 0;
  return enqueue(str("all_to_all_v(", dtype_name(input.dtype()), ")"), input.nbytes(), {output, input},
                 [&](ncclComm_t comm, cudaStream_t s) {
    const auto* in = static_cast<const char*>(input.raw_data());
    auto* out = static_cast<char*>(output.raw_data());
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < size_; ++r) {
      const auto sent = size_t(input_splits[size_t(r)]), received = size_t(output_splits[size_t(r)]);
      if (sent > 0) NCCL_CHECK(ncclSend(in, sent * row_numel, nccl_type(input.dtype()), r, comm, s));
      if (received > 0) NCCL_CHECK(ncclRecv(out, received * row_numel, nccl_type(input.dtype()), r, comm, s));
      in += sent * row_bytes, out += received * row_bytes;
    }
    NCCL_CHECK(ncclGroupEnd());
  });
}

std::shared_ptr<Work> NcclProcessGroup::barrier_async() {
  return enqueue("barrier", 0, {barrier_buffer_}, [&](ncclComm_t comm, cudaStream_t s) {
    NCCL_CHECK(ncclAllReduce(barrier_buffer_.raw_data(), barrier_buffer_.raw_data(), 1, ncclFloat32, ncclSum, comm, s));
  });
}

}  // namespace loom::parallel::nccl_backend

#endif  // LOOM_WITH_NCCL
