// The MPI backend on CUDA tensors (HostStaging in parallel/comm/mpi_checks.h),
// run by CTest under mpirun on 1 and 2 ranks (labels cuda and mpi). NCCL
// refuses two ranks on one GPU, so this is how ranks sharing the one GPU of
// the GPU machine exchange GPU tensors. Each collective runs twice, on a CUDA
// tensor and on the same values on the CPU: the staged run must give the
// CPU's bits (the reduction itself runs on the host in both). Skipped, with
// the reason, without a GPU; none of these has run on a GPU yet.
#include <gtest/gtest.h>

#include <vector>

#include "cuda_test.h"
#include "parallel/comm/distributed.h"
#include "tensor/ops.h"

using namespace loom;
using namespace loom::parallel;

namespace {

const std::vector<DType> kDTypes = {kFloat32, kBFloat16, kFloat16, kFloat64, kInt64};

class MpiCuda : public cuda_test::CudaTest {
 protected:
  ProcessGroup& world = parallel::world();
  int r = world.rank();
  int S = world.size();
  // Rank-dependent values in dtype: rank r's block differs from every other rank's.
  Tensor values(int64_t n, DType dtype, uint64_t seed = 1) const {
    return ops::to(cuda_test::random({n}, seed + uint64_t(r)), dtype);
  }
};

void expect_same_bits(const Tensor& gpu, const Tensor& cpu) {
  ASSERT_TRUE(gpu.device().is_cuda());
  EXPECT_EQ(ops::to(gpu, kCPU).to_vector<double>(), cpu.to_vector<double>()) << gpu.describe();
}

}  // namespace

TEST_F(MpiCuda, AllReduceGivesTheCpusBitsInEveryDtype) {
  for (DType dt : kDTypes)
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
      if (op == ReduceOp::Avg && !is_floating(dt)) continue;
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + reduce_op_name(op));
      Tensor cpu = values(1000, dt), dev = ops::to(cpu, gpu);
      world.all_reduce(cpu, op);
      world.all_reduce(dev, op);
      expect_same_bits(dev, cpu);
    }
}

// ZeRO's reduce-scatter: the output is this rank's block of the input itself.
TEST_F(MpiCuda, ReduceScatterIntoAViewOfItsInput) {
  const int64_t n = 64;
  Tensor cpu = values(n * S, kFloat32), dev = ops::to(cpu, gpu);
  world.reduce_scatter(ops::narrow(cpu, 0, r * n, n), cpu, ReduceOp::Avg);
  world.reduce_scatter(ops::narrow(dev, 0, r * n, n), dev, ReduceOp::Avg);
  expect_same_bits(dev, cpu);
}

// Expert parallelism's dispatch (parallel/expert_parallel/all_to_all.h) with GPU
// tensors staged through the host: rank r sends r + p + 1 rows to rank p; the
// CPU's exchange of the same rows gives the same bits.
TEST_F(MpiCuda, AllToAllVGivesTheCpusBits) {
  std::vector<int64_t> input_splits, output_splits;
  int64_t sent = 0, received = 0;
  for (int p = 0; p < S; ++p) {
    input_splits.push_back(r + p + 1), output_splits.push_back(p + r + 1);
    sent += r + p + 1, received += p + r + 1;
  }
  for (DType dt : kDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor cpu_in = ops::reshape(values(sent * 3, dt), {sent, 3});
    Tensor cpu_out = zeros({received, 3}, dt), dev_out = zeros({received, 3}, dt, gpu);
    world.all_to_all_v(cpu_out, cpu_in, output_splits, input_splits);
    world.all_to_all_v(dev_out, ops::to(cpu_in, gpu), output_splits, input_splits);
    expect_same_bits(dev_out, cpu_out);
  }
}

TEST_F(MpiCuda, AllGatherInPlaceAndFromASeparateInput) {
  const int64_t n = 100;
  for (DType dt : {kFloat32, kBFloat16}) {
    Tensor in_cpu = values(n, dt), out_cpu = zeros({n * S}, dt);
    Tensor in_gpu = ops::to(in_cpu, gpu), out_gpu = zeros({n * S}, dt, gpu);
    world.all_gather(out_cpu, in_cpu);
    world.all_gather(out_gpu, in_gpu);
    expect_same_bits(out_gpu, out_cpu);
    // In place: this rank's block already holds its input (ZeRO's param buffer).
    Tensor buf = ops::to(ops::mul(out_cpu, 0.0), gpu);
    ops::copy_(ops::narrow(buf, 0, r * n, n), in_gpu);
    world.all_gather(buf, ops::narrow(buf, 0, r * n, n));
    expect_same_bits(buf, out_cpu);
  }
}

TEST_F(MpiCuda, BroadcastFromEachRoot) {
  for (int root = 0; root < S; ++root) {
    Tensor cpu = values(50, kFloat32), dev = ops::to(cpu, gpu);
    world.broadcast(cpu, root);
    world.broadcast(dev, root);
    expect_same_bits(dev, cpu);
  }
}

// The pipeline's transfers: isend / irecv posted on this thread, and the
// queued send / recv, between ranks 0 and 1.
TEST_F(MpiCuda, PointToPointBetweenTwoRanks) {
  if (S < 2) GTEST_SKIP() << "needs 2 ranks";
  if (r > 1) return;
  Tensor sent = ops::to(cuda_test::random({3, 5}, 42), gpu);
  Tensor got = zeros({3, 5}, kFloat32, gpu), got2 = zeros({3, 5}, kFloat32, gpu);
  if (r == 0) {
    world.isend(sent, 1, 7)->wait();
    world.send(sent, 1, 8);
  } else {
    world.irecv(got, 0, 7)->wait();
    world.recv(got2, 0, 8);
    expect_same_bits(got, ops::to(sent, kCPU));
    expect_same_bits(got2, ops::to(sent, kCPU));
  }
}

// Stream order: the values a queued all-reduce reads were written by a kernel
// still waiting behind a long matmul on loom's stream when the all-reduce was
// launched (a bucket launched from the AccumulateGrad hook right after
// main_grad += grad was enqueued). The copy down must wait for that write.
TEST_F(MpiCuda, AnAllReduceLaunchedBehindALongKernelReadsItsResult) {
  Tensor a = ops::to(cuda_test::random({2048, 2048}, 3), gpu);
  Tensor t = zeros({4096}, kFloat32, gpu), ones = full({4096}, 1.0, kFloat32, gpu);
  Tensor busy = ops::matmul(a, a);  // enqueued, not finished
  ops::add_(t, ones, 1.0 + r);      // queued behind it
  auto work = world.all_reduce_async(t, ReduceOp::Sum);
  work->wait();
  const double expected = double(S) * double(S + 1) / 2;  // 1 + 2 + ... + S
  for (double v : ops::to(t, kCPU).to_vector<double>()) ASSERT_EQ(v, expected);
  EXPECT_EQ(busy.shape(), (Shape{2048, 2048}));
}

// A kernel's bad index (context.h's record) belongs to the compute thread: a
// queued all-reduce whose copy down synchronises first on the group's thread
// must not report it (as its own failure) nor consume it. The next .item()
// on this thread does, in the CPU op's words.
TEST_F(MpiCuda, ABadIndexIsReportedByTheNextItemNotByACollective) {
  Tensor w = ops::to(cuda_test::random({4, 3}, 5), gpu);
  Tensor rows = ops::embedding(w, ops::to(from_vector<int64_t>({1, 7}), gpu));  // 7: past the 4 rows; no host wait
  Tensor t = full({256}, 1.0, kFloat32, gpu);
  EXPECT_NO_THROW(world.all_reduce_async(t, ReduceOp::Sum)->wait());
  try {
    (void)ops::sum(rows).item<double>();
    ADD_FAILURE() << "the bad index was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("embedding: index 7 out of range for 4 rows"), std::string::npos) << e.what();
  }
  for (double v : ops::to(t, kCPU).to_vector<double>()) ASSERT_EQ(v, double(S));
}
