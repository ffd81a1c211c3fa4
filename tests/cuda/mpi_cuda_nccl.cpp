// The NCCL backend (parallel/comm/process_group_nccl.h), run by CTest under
// mpirun on 1 rank (labels cuda and mpi): NCCL refuses two ranks on one GPU,
// and the GPU machine has one. On one rank every collective is the identity,
// so each test checks the exact values NCCL hands back, in fp32, bf16 and
// int64, plus the in-place and aliased forms ZeRO uses, expert parallelism's
// all-to-all, the argument checks, and the stream order (an all-reduce reads
// what loom's stream wrote before it). Written for any world size (each rank
// on cuda:<rank % GPUs>).
//
// Without a GPU every test skips with the reason, except the two that check
// how the build behaves there. None of these has run on a GPU yet.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "../error_of.h"
#include "cuda_test.h"
#include "parallel/comm/distributed.h"
#include "parallel/comm/process_group_nccl.h"
#include "tensor/cuda/cuda.h"
#include "tensor/ops.h"

using namespace loom;
using namespace loom::parallel;
using loom::test::error_of;

namespace {

// One NCCL world for the whole binary (making a communicator takes a while),
// destroyed when the tests end, before main() finalizes MPI.
std::unique_ptr<ProcessGroup>& nccl_world() {
  static std::unique_ptr<ProcessGroup> group;
  return group;
}
class DestroyNcclWorld : public ::testing::Environment {
 public:
  void TearDown() override { nccl_world().reset(); }
};
[[maybe_unused]] ::testing::Environment* const kDestroyNcclWorld =
    ::testing::AddGlobalTestEnvironment(new DestroyNcclWorld);

const std::vector<DType> kDTypes = {kFloat32, kBFloat16, kInt64};

class Nccl : public cuda_test::CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    if (!built_with_nccl()) GTEST_SKIP() << "loom was built without NCCL";
    if (!nccl_world()) nccl_world() = make_nccl_world(parallel::world(), dev);
  }
  ProcessGroup& group() { return *nccl_world(); }

  const int r = parallel::world().rank();
  const int S = parallel::world().size();
  const Device dev{DeviceType::CUDA, cuda::device_count() > 0 ? r % cuda::device_count() : 0};

  // base[i] = i % 7 - 3 (exact in every dtype), times (rank + 1): ranks differ.
  static std::vector<double> base(int64_t n, int rank) {
    std::vector<double> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = double(i % 7 - 3) * double(rank + 1);
    return v;
  }
  Tensor values(int64_t n, DType dtype, int rank) const {
    return ops::to(from_vector<double>(base(n, rank)), dev, dtype);
  }
  static std::vector<double> on_host(const Tensor& t) { return ops::to(t, kCPU).to_vector<double>(); }
  // Element i reduced over ranks 0..S-1 of base(n, rank).
  std::vector<double> reduced(int64_t n, ReduceOp op) const {
    std::vector<double> out(static_cast<size_t>(n), 0.0);
    for (int q = 0; q < S; ++q) {
      std::vector<double> v = base(n, q);
      for (size_t i = 0; i < out.size(); ++i) {
        if (op == ReduceOp::Max) out[i] = q == 0 ? v[i] : std::max(out[i], v[i]);
        else out[i] += v[i];
      }
    }
    if (op == ReduceOp::Avg)
      for (double& x : out) x /= double(S);
    return out;
  }
};

// Sums and maxima of these small whole numbers are exact in every dtype; a
// mean over several ranks may round (NCCL may scale by 1/S before summing).
void expect_values(const std::vector<double>& got, const std::vector<double>& want, double rtol = 0) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i)
    if (std::fabs(got[i] - want[i]) > rtol * std::fabs(want[i])) {
      ADD_FAILURE() << "element " << i << ": got " << got[i] << ", expected " << want[i];
      ++bad;
    }
}

}  // namespace

// ---- everywhere: what the build has, and the error on a machine without a GPU ----

TEST(NcclBuild, HasTheBackendExactlyWhenCMakeFoundNccl) {
  EXPECT_EQ(built_with_nccl(), bool(LOOM_TEST_NCCL_FOUND));
}

TEST(NcclBuild, MakingTheWorldWithoutAGpuThrowsNamingTheCause) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  const std::string message = error_of([] { make_nccl_world(parallel::world(), Device("cuda:0")); });
  if (built_with_nccl()) {
    EXPECT_NE(message.find("make_nccl_world: no CUDA device on this machine"), std::string::npos) << message;
  } else {
    EXPECT_NE(message.find("the NCCL backend is not built"), std::string::npos) << message;
  }
}

// ---- on a GPU ---------------------------------------------------------------------

TEST_F(Nccl, WorldHasTheBootstrapGroupsRanks) {
  EXPECT_EQ(group().rank(), r);
  EXPECT_EQ(group().size(), S);
  EXPECT_EQ(group().name(), "world");
}

TEST_F(Nccl, AllReduceSumAvgMaxInEveryDtype) {
  const int64_t n = 1000;
  for (DType dt : kDTypes)
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
      if (op == ReduceOp::Avg && !is_floating(dt)) continue;
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + reduce_op_name(op));
      Tensor t = values(n, dt, r);
      group().all_reduce_async(t, op)->wait();
      expect_values(on_host(t), reduced(n, op), op == ReduceOp::Avg && S > 1 ? cuda_test::rtol_for(dt) : 0.0);
    }
}

// ZeRO's reduce-scatter writes this rank's shard of the bucket itself (NCCL's
// in-place form); a separate output; and an output that overlaps the input
// elsewhere (reduced into a buffer aside, then copied).
TEST_F(Nccl, ReduceScatterIntoASeparateOutputItsOwnBlockAndAnOverlappingOutput) {
  const int64_t n = 96;
  for (DType dt : kDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<double> full = reduced(n * S, ReduceOp::Sum);
    std::vector<double> mine(full.begin() + r * n, full.begin() + (r + 1) * n);

    Tensor input = values(n * S, dt, r), output = zeros({n}, dt, dev);
    group().reduce_scatter(output, input, ReduceOp::Sum);
    EXPECT_EQ(on_host(output), mine);

    Tensor bucket = values(n * S, dt, r);
    group().reduce_scatter(ops::narrow(bucket, 0, r * n, n), bucket, ReduceOp::Sum);
    EXPECT_EQ(on_host(ops::narrow(bucket, 0, r * n, n)), mine);

    Tensor buf = zeros({n * S + 1}, dt, dev);
    ops::copy_(ops::narrow(buf, 0, 0, n * S), values(n * S, dt, r));
    group().reduce_scatter(ops::narrow(buf, 0, r * n + 1, n), ops::narrow(buf, 0, 0, n * S), ReduceOp::Sum);
    EXPECT_EQ(on_host(ops::narrow(buf, 0, r * n + 1, n)), mine);
  }
}

// Rank q's input lands at block q: from a separate input, in place (ZeRO's
// param buffer), and from an input that overlaps the output elsewhere.
TEST_F(Nccl, AllGatherFromASeparateInputInPlaceAndFromAnOverlappingInput) {
  const int64_t n = 50;
  for (DType dt : kDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<double> expected;
    for (int q = 0; q < S; ++q) {
      std::vector<double> v = base(n, q);
      expected.insert(expected.end(), v.begin(), v.end());
    }

    Tensor output = zeros({n * S}, dt, dev);
    group().all_gather(output, values(n, dt, r));
    EXPECT_EQ(on_host(output), expected);

    Tensor params = zeros({n * S}, dt, dev);
    ops::copy_(ops::narrow(params, 0, r * n, n), values(n, dt, r));
    group().all_gather(params, ops::narrow(params, 0, r * n, n));
    EXPECT_EQ(on_host(params), expected);

    Tensor buf = zeros({n * S + 1}, dt, dev);
    ops::copy_(ops::narrow(buf, 0, r * n + 1, n), values(n, dt, r));
    group().all_gather(ops::narrow(buf, 0, 0, n * S), ops::narrow(buf, 0, r * n + 1, n));
    EXPECT_EQ(on_host(ops::narrow(buf, 0, 0, n * S)), expected);
  }
}

TEST_F(Nccl, BroadcastGivesEveryRankTheRootsValues) {
  for (DType dt : kDTypes)
    for (int root = 0; root < S; ++root) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " root " + std::to_string(root));
      Tensor t = values(300, dt, r);
      group().broadcast(t, root);
      EXPECT_EQ(on_host(t), base(300, root));
    }
}

TEST_F(Nccl, BarrierCompletesAndLeavesTheStreamUsable) {
  group().barrier();
  Tensor t = values(10, kFloat32, r);
  group().all_reduce(t, ReduceOp::Max);
  EXPECT_EQ(on_host(t), reduced(10, ReduceOp::Max));
}

// Each rank alone in its group (color = rank); color < 0 gives no group.
TEST_F(Nccl, SplitIntoGroupsOfOne) {
  std::unique_ptr<ProcessGroup> solo = group().split(r, 0, "solo");
  ASSERT_NE(solo, nullptr);
  EXPECT_EQ(solo->size(), 1);
  EXPECT_EQ(solo->rank(), 0);
  EXPECT_EQ(solo->name(), "solo");
  Tensor t = values(64, kBFloat16, r);
  solo->all_reduce(t, ReduceOp::Sum);
  EXPECT_EQ(on_host(t), base(64, r));
  EXPECT_EQ(group().split(-1, 0, "none"), nullptr);
}

TEST_F(Nccl, PointToPointBetweenRanksZeroAndOne) {
  if (S < 2) GTEST_SKIP() << "needs 2 ranks (2 GPUs)";
  if (r > 1) return;
  Tensor t = r == 0 ? values(77, kFloat32, 5) : zeros({77}, kFloat32, dev);
  if (r == 0) group().send(t, 1, 3);
  else group().recv(t, 0, 3);
  EXPECT_EQ(on_host(t), base(77, 5));
}

// Expert parallelism's dispatch (parallel/expert_parallel/all_to_all.h) on NCCL: rank r
// sends r + p + 1 rows to rank p, one grouped ncclSend/ncclRecv per peer (the
// one to itself included); each peer's block lands where the output splits say.
TEST_F(Nccl, AllToAllVPutsEachPeersBlockWhereTheSplitsSay) {
  const int64_t C = 3;
  auto rows = [](int from, int to) { return int64_t(from + to + 1); };
  auto rows_of = [&](int from) {  // all that rank `from` sends
    int64_t n = 0;
    for (int q = 0; q < S; ++q) n += rows(from, q);
    return n;
  };
  for (DType dt : kDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<int64_t> input_splits, output_splits;
    std::vector<double> expected;
    for (int p = 0; p < S; ++p) {
      input_splits.push_back(rows(r, p)), output_splits.push_back(rows(p, r));
      int64_t at = 0;  // where p's block for this rank begins among p's rows
      for (int q = 0; q < r; ++q) at += rows(p, q);
      const std::vector<double> v = base(rows_of(p) * C, p);
      expected.insert(expected.end(), v.begin() + at * C, v.begin() + (at + rows(p, r)) * C);
    }
    int64_t received = 0;
    for (int64_t n : output_splits) received += n;
    Tensor output = zeros({received, C}, dt, dev);
    group().all_to_all_v(output, ops::reshape(values(rows_of(r) * C, dt, r), {rows_of(r), C}), output_splits,
                         input_splits);
    EXPECT_EQ(on_host(output), expected);
  }
}

// Checked on the calling thread, before anything reaches NCCL.
TEST_F(Nccl, BadArgumentsAreRefusedNamingTheOpAndTheTensor) {
  const std::string d = dev.str();
  EXPECT_NE(error_of([&] { group().all_reduce(ones({4})); })
                .find("all_reduce: the NCCL backend takes CUDA tensors on " + d + ", got tensor [4] float32 on cpu"),
            std::string::npos);
  Tensor wide = zeros({3, 4}, kFloat32, dev);
  EXPECT_NE(error_of([&] { group().broadcast(ops::transpose(wide, 0, 1), 0); })
                .find("broadcast: tensor [4, 3] float32 must be contiguous"),
            std::string::npos);
  EXPECT_NE(error_of([&] { group().all_reduce(zeros({4}, kInt64, dev), ReduceOp::Avg); })
                .find("all_reduce: ReduceOp::Avg needs a floating dtype, got [4] int64"),
            std::string::npos);
  EXPECT_NE(error_of([&] { group().reduce_scatter(zeros({3}, kFloat32, dev), zeros({3 * S + 1}, kFloat32, dev)); })
                .find("reduce_scatter: input of " + std::to_string(3 * S + 1) + " elements is not"),
            std::string::npos);
  EXPECT_NE(error_of([&] { group().all_gather(zeros({2 * S}, kFloat32, dev), zeros({2}, kBFloat16, dev)); })
                .find("all_gather: input [2] bfloat16 and output"),
            std::string::npos);
  EXPECT_NE(error_of([&] { group().broadcast(zeros({2}, kFloat32, dev), S); }).find("broadcast: root " +
            std::to_string(S) + " is not a rank of group world"), std::string::npos);
  EXPECT_NE(error_of([&] { group().send(zeros({2}, kFloat32, dev), r); }).find("cannot send to/from itself"),
            std::string::npos);
  EXPECT_NE(error_of([&] { group().recv(zeros({2}, kFloat32, dev), S); }).find("recv: rank " + std::to_string(S) +
            " is not in group world"), std::string::npos);
}

// Stream order: the all-reduce is launched while the value it reads is still
// queued on loom's stream behind long matmuls (a bucket launched from the
// AccumulateGrad hook right after main_grad += grad was enqueued). The group's
// stream waits for an event, so NCCL reads the added values, not the zeros.
TEST_F(Nccl, AnAllReduceLaunchedBehindLongKernelsReadsTheirResult) {
  Tensor t = zeros({1 << 20}, kFloat32, dev), ones_ = full({1 << 20}, 1.0, kFloat32, dev);
  Tensor a = ops::to(cuda_test::random({4096, 4096}, 3), dev);
  Tensor busy = a;
  for (int i = 0; i < 4; ++i) busy = ops::matmul(busy, a);  // enqueued, far from finished
  ops::add_(t, ones_, 1.0 + r);                             // queued behind them
  std::shared_ptr<Work> work = group().all_reduce_async(t, ReduceOp::Sum);
  work->wait();
  const double expected = double(S) * double(S + 1) / 2;  // 1 + 2 + ... + S
  for (double v : on_host(t)) ASSERT_EQ(v, expected);
  EXPECT_EQ(busy.shape(), (Shape{4096, 4096}));
}

// wait() orders loom's stream after the operation without blocking the host;
// once loom's stream has drained, the operation is complete. A Work dropped
// unwaited keeps its tensors until the operation is done (its destructor waits).
TEST_F(Nccl, WorkCompletesAfterItsStreamDrainsAndMayBeDroppedUnwaited) {
  Tensor t = values(4096, kFloat32, r);
  std::shared_ptr<Work> work = group().all_reduce_async(t, ReduceOp::Sum);
  work->wait();
  cuda::synchronize(dev);
  EXPECT_TRUE(work->is_completed());
  EXPECT_EQ(on_host(t), reduced(4096, ReduceOp::Sum));
  {
    Tensor dropped = values(1 << 16, kFloat32, r);
    group().all_reduce_async(dropped, ReduceOp::Sum);  // neither the Work nor the tensor is kept
  }
  Tensor after = values(1 << 16, kFloat32, r);
  group().all_reduce(after, ReduceOp::Sum);
  EXPECT_EQ(on_host(after), reduced(1 << 16, ReduceOp::Sum));
}
