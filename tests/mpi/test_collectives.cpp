// ProcessGroup collectives on the MPI backend, run by CTest on 1, 2, 3 and 4
// ranks. Each rank contributes values that depend on its rank, so every
// expected result is a closed form in the world size S, the rank r and the
// element index i - small integers, exact in every dtype, bf16 and fp16 too.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "parallel/comm/distributed.h"
#include "tensor/ops.h"

using namespace loom;
using namespace loom::parallel;

namespace {

const std::vector<DType> kAllDTypes = {kFloat64, kFloat32, kBFloat16, kFloat16, kInt32, kInt64};

// values -> a tensor of `dtype`, and back.
Tensor make(const std::vector<double>& v, DType dtype) { return ops::to(from_vector(v), dtype); }
std::vector<double> values(const Tensor& t) { return ops::to(t, kFloat64).to_vector<double>(); }

// [f(0), f(1), ..., f(n-1)]
std::vector<double> table(int64_t n, const std::function<double(double)>& f) {
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(f(double(i)));
  return v;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

class Collectives : public ::testing::TestWithParam<DType> {
 protected:
  ProcessGroup& world = parallel::world();
  DType dt = GetParam();
  int r = world.rank();
  double S = world.size();
};

std::string dtype_test_name(const ::testing::TestParamInfo<DType>& info) { return dtype_name(info.param); }

}  // namespace

TEST(World, RanksAreDistinctAndCoverTheWorld) {
  ProcessGroup& world = parallel::world();
  EXPECT_EQ(world.name(), "world");
  Tensor t = from_vector<int64_t>({world.rank()});
  world.all_reduce(t);
  EXPECT_EQ(t.item<int64_t>(), int64_t(world.size()) * (world.size() - 1) / 2);  // 0 + 1 + ... + S-1
}

// Rank r holds (r + 1) * (i + 1): sum (i+1) S(S+1)/2, max (i+1) S, mean (i+1)(S+1)/2.
TEST_P(Collectives, AllReduceSumMaxAvg) {
  auto mine = table(8, [&](double i) { return (r + 1) * (i + 1); });
  Tensor sum = make(mine, dt), max = make(mine, dt);
  world.all_reduce(sum, ReduceOp::Sum);
  world.all_reduce(max, ReduceOp::Max);
  EXPECT_EQ(values(sum), table(8, [&](double i) { return (i + 1) * S * (S + 1) / 2; }));
  EXPECT_EQ(values(max), table(8, [&](double i) { return (i + 1) * S; }));
  EXPECT_EQ(sum.dtype(), dt);
  if (is_floating(dt)) {
    Tensor avg = make(mine, dt);
    world.all_reduce(avg, ReduceOp::Avg);
    EXPECT_EQ(values(avg), table(8, [&](double i) { return (i + 1) * (S + 1) / 2; }));
  } else {
    Tensor t = make(mine, dt);
    EXPECT_NE(error_of([&] { world.all_reduce(t, ReduceOp::Avg); }).find("ReduceOp::Avg needs a floating dtype"),
              std::string::npos);
  }
}

TEST_P(Collectives, AsyncAllReduceGivesTheSameResult) {
  Tensor a = make(table(5, [&](double i) { return r + i; }), dt);
  Tensor b = make(table(3, [&](double) { return r; }), dt);
  auto wa = world.all_reduce_async(a, ReduceOp::Sum);
  auto wb = world.all_reduce_async(b, ReduceOp::Max);
  wb->wait();
  EXPECT_TRUE(wa->is_completed());  // FIFO: a was queued first
  wa->wait();                       // waiting again is fine
  EXPECT_EQ(values(a), table(5, [&](double i) { return S * (S - 1) / 2 + S * i; }));
  EXPECT_EQ(values(b), table(3, [&](double) { return S - 1; }));
}

// input[j] on rank q = q + 1 + j, j in [0, S*n); rank r keeps block r of the sum:
// out[i] = sum_q (q + 1 + r*n + i) = S(S+1)/2 + S (r*n + i).
TEST_P(Collectives, ReduceScatterGivesEachRankItsBlockOfTheSum) {
  const int64_t n = 4;
  Tensor input = make(table(int64_t(S) * n, [&](double j) { return r + 1 + j; }), dt);
  Tensor output = make(table(n, [](double) { return -1; }), dt);
  world.reduce_scatter(output, input, ReduceOp::Sum);
  EXPECT_EQ(values(output), table(n, [&](double i) { return S * (S + 1) / 2 + S * (r * n + i); }));
  auto in = values(input);  // the input is left alone
  EXPECT_EQ(in, table(int64_t(S) * n, [&](double j) { return r + 1 + j; }));
}

// In place: the output is this rank's block of the input, as ZeRO-1 does with
// a bucket and its shard.
TEST_P(Collectives, ReduceScatterIntoOwnBlockOfTheInput) {
  const int64_t n = 3;
  Tensor input = make(table(int64_t(S) * n, [&](double j) { return r + 1 + j; }), dt);
  Tensor shard = ops::narrow(input, 0, r * n, n);
  if (is_floating(dt)) {
    world.reduce_scatter(shard, input, ReduceOp::Avg);
    EXPECT_EQ(values(shard), table(n, [&](double i) { return (S + 1) / 2 + r * n + i; }));
  } else {
    world.reduce_scatter(shard, input, ReduceOp::Max);
    EXPECT_EQ(values(shard), table(n, [&](double i) { return S + r * n + i; }));
  }
}

// Rank q contributes [10 q + i]; everyone gets all blocks in rank order.
TEST_P(Collectives, AllGatherConcatenatesInRankOrder) {
  const int64_t n = 3;
  Tensor input = make(table(n, [&](double i) { return 10 * r + i; }), dt);
  Tensor output = make(table(int64_t(S) * n, [](double) { return -1; }), dt);
  auto expected = table(int64_t(S) * n, [&](double j) { return 10 * std::floor(j / n) + std::fmod(j, n); });
  world.all_gather(output, input);
  EXPECT_EQ(values(output), expected);
  // In place: the input already sits at this rank's block of the output.
  Tensor buffer = make(table(int64_t(S) * n, [](double) { return -1; }), dt);
  Tensor own = ops::narrow(buffer, 0, r * n, n);
  ops::copy_(own, input);
  world.all_gather(buffer, own);
  EXPECT_EQ(values(buffer), expected);
}

TEST_P(Collectives, BroadcastCopiesTheRootsTensor) {
  int root = world.size() - 1;
  Tensor t = make(table(6, [&](double i) { return r * 7 + i; }), dt);
  world.broadcast(t, root);
  EXPECT_EQ(values(t), table(6, [&](double i) { return root * 7 + i; }));
}

// Even ranks send then receive, odd ranks the reverse, so each blocking send
// meets a posted receive even with an odd number of ranks.
TEST_P(Collectives, SendRecvAroundARing) {
  if (world.size() == 1) {
    Tensor t = make({1}, dt);
    EXPECT_NE(error_of([&] { world.send(t, 0); }).find("cannot send to/from itself"), std::string::npos);
    return;
  }
  int next = (r + 1) % world.size(), prev = (r + world.size() - 1) % world.size();
  Tensor out = make(table(5, [&](double i) { return 3 * r + i; }), dt);
  Tensor in = make(table(5, [](double) { return -1; }), dt);
  if (r % 2 == 0) {
    world.send(out, next, /*tag=*/7);
    world.recv(in, prev, 7);
  } else {
    world.recv(in, prev, 7);
    world.send(out, next, 7);
  }
  EXPECT_EQ(values(in), table(5, [&](double i) { return 3 * prev + i; }));
}

INSTANTIATE_TEST_SUITE_P(EveryDType, Collectives, ::testing::ValuesIn(kAllDTypes), dtype_test_name);

// Small messages are buffered by MPI, so rank 1 can receive them in the
// opposite order to the sends: matching is by tag, not arrival.
TEST(PointToPoint, TagsSelectTheMessage) {
  ProcessGroup& world = parallel::world();
  if (world.size() == 1) GTEST_SKIP() << "point to point needs a second rank";
  Tensor a = from_vector<float>({1, 2}), b = from_vector<float>({3, 4, 5});
  if (world.rank() == 0) {
    world.send(a, 1, /*tag=*/1);
    world.send(b, 1, /*tag=*/2);
  } else if (world.rank() == 1) {
    Tensor rb = zeros({3}), ra = zeros({2});
    world.recv(rb, 0, 2);
    world.recv(ra, 0, 1);
    EXPECT_EQ(ra.to_vector<float>(), (std::vector<float>{1, 2}));
    EXPECT_EQ(rb.to_vector<float>(), (std::vector<float>{3, 4, 5}));
  }
}

// 4 MiB: too big for MPI's eager buffers, so the send only completes once the
// receive is posted (the rendezvous protocol).
TEST(PointToPoint, LargeMessage) {
  ProcessGroup& world = parallel::world();
  if (world.size() == 1) GTEST_SKIP() << "point to point needs a second rank";
  const int64_t n = 1 << 20;
  if (world.rank() == 0) {
    world.send(ops::to(arange(n), kFloat32), 1);
  } else if (world.rank() == 1) {
    Tensor t = zeros({n});
    world.recv(t, 0);
    std::vector<float> v = t.to_vector<float>();
    EXPECT_EQ(v[0], 0.f);
    EXPECT_EQ(v[12345], 12345.f);
    EXPECT_EQ(v[size_t(n - 1)], float(n - 1));
  }
}

// An error on the communication thread travels to wait(): rank 1 expects 4
// elements, rank 0 sends 3.
TEST(PointToPoint, ShortMessageIsAnErrorOnWait) {
  ProcessGroup& world = parallel::world();
  if (world.size() == 1) GTEST_SKIP() << "point to point needs a second rank";
  if (world.rank() == 0) {
    world.send(from_vector<float>({1, 2, 3}), 1);
  } else if (world.rank() == 1) {
    Tensor t = zeros({4});
    auto work = world.recv_async(t, 0);
    std::string msg = error_of([&] { work->wait(); });
    EXPECT_NE(msg.find("recv: expected 4 elements"), std::string::npos) << msg;
    EXPECT_NE(msg.find("holds 3"), std::string::npos) << msg;
    EXPECT_TRUE(work->is_completed());
  }
}

// isend / irecv run on the caller's thread (the pipeline's transfers): a
// receive posted before its message is sent is not complete, then completes
// with the data once the send comes (4 MiB: MPI's rendezvous protocol).
TEST(PointToPoint, IrecvPostedEarlyCompletesWithTheDataOnceSent) {
  ProcessGroup& world = parallel::world();
  if (world.size() == 1) GTEST_SKIP() << "point to point needs a second rank";
  const int64_t n = 1 << 20;
  if (world.rank() == 1) {
    Tensor t = zeros({n});
    auto work = world.irecv(t, 0, /*tag=*/3);
    EXPECT_FALSE(work->is_completed());  // rank 0 sends only after the barrier
    world.barrier();
    work->wait();
    EXPECT_TRUE(work->is_completed());
    std::vector<float> v = t.to_vector<float>();
    EXPECT_EQ(v[0], 0.f);
    EXPECT_EQ(v[54321], 54321.f);
    EXPECT_EQ(v[size_t(n - 1)], float(n - 1));
  } else {
    world.barrier();
    if (world.rank() == 0) world.isend(ops::to(arange(n), kFloat32), 1, 3)->wait();
  }
}

// irecv checks the element count as recv does, on the caller's thread.
TEST(PointToPoint, ShortMessageIsAnErrorOnIrecvWait) {
  ProcessGroup& world = parallel::world();
  if (world.size() == 1) GTEST_SKIP() << "point to point needs a second rank";
  if (world.rank() == 0) {
    world.isend(from_vector<float>({1, 2, 3}), 1)->wait();
  } else if (world.rank() == 1) {
    Tensor t = zeros({4});
    auto work = world.irecv(t, 0);
    std::string msg = error_of([&] { work->wait(); });
    EXPECT_NE(msg.find("recv(from 0, tag 0) on group world: expected 4 elements"), std::string::npos) << msg;
    EXPECT_NE(msg.find("holds 3"), std::string::npos) << msg;
    EXPECT_TRUE(work->is_completed());
  }
}

// 50 operations in flight at once: they finish in the order they were issued
// (FIFO, like a CUDA stream), with the right values.
TEST(Async, FiftyOutstandingOperationsCompleteInOrder) {
  ProcessGroup& world = parallel::world();
  const int r = world.rank();
  const double S = world.size();
  std::vector<Tensor> ts;
  std::vector<std::shared_ptr<Work>> works;
  for (int k = 0; k < 50; ++k) {
    ts.push_back(full({1000}, k + r));
    works.push_back(k % 5 == 4 ? world.broadcast_async(ts.back(), 0) : world.all_reduce_async(ts.back()));
  }
  // Whenever operation k is seen completed, every earlier one is too.
  for (int k = 49; k >= 0; --k) {
    works[size_t(k)]->wait();
    for (int j = 0; j < k; ++j) EXPECT_TRUE(works[size_t(j)]->is_completed()) << j << " after " << k;
  }
  for (int k = 0; k < 50; ++k) {
    double expected = k % 5 == 4 ? k : S * k + S * (S - 1) / 2;
    std::vector<float> v = ts[size_t(k)].to_vector<float>();
    EXPECT_EQ(v.front(), float(expected)) << k;
    EXPECT_EQ(v.back(), float(expected)) << k;
  }
}

TEST(Async, BarrierAndSyncOpsQueueBehindAsyncOnes) {
  ProcessGroup& world = parallel::world();
  Tensor t = full({4}, 1.0);
  auto w = world.all_reduce_async(t);
  world.barrier();  // the same queue: returns only after the all-reduce has run
  EXPECT_TRUE(w->is_completed());
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(4, float(world.size())));
}

// Checks run on the calling thread, before anything is queued: the same error
// on every rank, and the group stays usable.
TEST(Errors, BadCallsThrowBeforeCommunicating) {
  ProcessGroup& world = parallel::world();
  const int S = world.size();
  Tensor out = zeros({2});
  Tensor in = zeros({2 * S + 1});
  std::string msg = error_of([&] { world.reduce_scatter(out, in); });
  EXPECT_NE(msg.find("reduce_scatter: input of " + std::to_string(2 * S + 1) + " elements is not " +
                     std::to_string(S) + " ranks x output of 2 elements"),
            std::string::npos)
      << msg;
  msg = error_of([&] { world.all_gather(zeros({2 * S + 1}), zeros({2})); });
  EXPECT_NE(msg.find("all_gather: output of"), std::string::npos) << msg;
  msg = error_of([&] { world.all_reduce(ops::transpose(zeros({2, 3}), 0, 1)); });
  EXPECT_NE(msg.find("must be contiguous"), std::string::npos) << msg;
  msg = error_of([&] { world.broadcast(zeros({2}), S); });
  EXPECT_NE(msg.find("broadcast: root " + std::to_string(S) + " is not a rank"), std::string::npos) << msg;
  msg = error_of([&] { world.reduce_scatter(zeros({1}, kFloat32), zeros({S}, kFloat64)); });
  EXPECT_NE(msg.find("differ in dtype"), std::string::npos) << msg;
  world.barrier();
}

// Sub-groups: even and odd ranks. Each has its own communicator and thread.
TEST(Split, EvenAndOddRanks) {
  ProcessGroup& world = parallel::world();
  const int r = world.rank(), S = world.size();
  auto group = world.split(r % 2, r, r % 2 ? "odd" : "even");
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->rank(), r / 2);
  EXPECT_EQ(group->size(), r % 2 ? S / 2 : (S + 1) / 2);
  Tensor t = from_vector<int64_t>({r});
  group->all_reduce(t);
  int64_t expected = 0;
  for (int q = r % 2; q < S; q += 2) expected += q;
  EXPECT_EQ(t.item<int64_t>(), expected);
  // A negative color: not a member.
  auto none = world.split(r == 0 ? -1 : 0, r, "not_zero");
  EXPECT_EQ(none == nullptr, r == 0);
  if (none) {
    EXPECT_EQ(none->size(), S - 1);
  }
}

// ---- ranks that disagree ---------------------------------------------------------
// Every collective first compares what each rank is about to run (which op, its
// dtype and element count). A mismatch is an error on every rank, naming the
// group, this rank's call and another rank's - not a hang, not MPI reading past
// a buffer (two dp ranks with different vocabularies used to corrupt the heap
// in the parameter broadcast). The group stays usable afterwards.

namespace {

// Expects msg to be the disagreement error of rank r, in `call`, naming `other`.
void expect_disagreement(const std::string& msg, const std::string& here, const std::string& other) {
  EXPECT_NE(msg.find("ranks disagree on group world (size " + std::to_string(parallel::world().size()) + "): " +
                     here),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find(other), std::string::npos) << msg;
}

void expect_group_still_works() {
  ProcessGroup& world = parallel::world();
  Tensor t = full({3}, 1.0);
  world.all_reduce(t);
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(3, float(world.size())));
}

}  // namespace

// Rank r broadcasts 100 + 10 r floats; root is the last rank, the largest buffer.
TEST(Disagreement, BroadcastOfDifferentSizesIsAnErrorOnEveryRank) {
  ProcessGroup& world = parallel::world();
  const int r = world.rank(), S = world.size();
  if (S == 1) GTEST_SKIP() << "needs a second rank to disagree with";
  Tensor t = full({100 + 10 * r}, double(r));
  std::string msg = error_of([&] { world.broadcast(t, S - 1); });
  // The last rank sees rank 0's minimum; every other rank sees the last rank's maximum.
  int other = r == S - 1 ? 0 : S - 1;
  const std::string mine = std::to_string(100 + 10 * r), theirs = std::to_string(100 + 10 * other);
  expect_disagreement(msg, "rank " + std::to_string(r) + " is in broadcast(float32) of " + mine + " elements",
                      "but rank " + std::to_string(other) + " passes " + theirs + " elements");
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(size_t(100 + 10 * r), float(r)));  // nothing was received
  expect_group_still_works();
}

TEST(Disagreement, AllReduceOfDifferentDTypes) {
  ProcessGroup& world = parallel::world();
  const int r = world.rank();
  if (world.size() == 1) GTEST_SKIP() << "needs a second rank to disagree with";
  Tensor t = zeros({8}, r == 0 ? kFloat32 : kFloat64);
  std::string msg = error_of([&] { world.all_reduce(t); });
  if (r == 0) {
    expect_disagreement(msg, "rank 0 is in all_reduce(sum, float32)", "but rank 1 is in all_reduce(sum, float64)");
  } else {
    expect_disagreement(msg, "rank " + std::to_string(r) + " is in all_reduce(sum, float64)",
                        "but rank 0 is in all_reduce(sum, float32)");
  }
  expect_group_still_works();
}

// Rank 0 all-reduces while the others broadcast the same 16 floats.
TEST(Disagreement, DifferentCollectives) {
  ProcessGroup& world = parallel::world();
  const int r = world.rank();
  if (world.size() == 1) GTEST_SKIP() << "needs a second rank to disagree with";
  Tensor t = zeros({16});
  std::string msg = error_of([&] { r == 0 ? world.all_reduce(t, ReduceOp::Max) : world.broadcast(t, 0); });
  expect_disagreement(msg, "rank " + std::to_string(r) + " is in " + (r == 0 ? "all_reduce(max" : "broadcast(float32)"),
                      r == 0 ? "but rank 1 is in broadcast(float32)" : "but rank 0 is in all_reduce(max, float32)");
  expect_group_still_works();
}

// all_gather and reduce_scatter compare the per-rank block: rank r's is 4 + r.
TEST(Disagreement, AllGatherAndReduceScatterBlocks) {
  ProcessGroup& world = parallel::world();
  const int r = world.rank(), S = world.size();
  if (S == 1) GTEST_SKIP() << "needs a second rank to disagree with";
  int other = r == S - 1 ? 0 : S - 1;
  std::string theirs = "but rank " + std::to_string(other) + " passes " + std::to_string(4 + other) + " elements";
  std::string msg = error_of([&] { world.all_gather(zeros({S * (4 + r)}), zeros({4 + r})); });
  expect_disagreement(msg, "rank " + std::to_string(r) + " is in all_gather(float32) of " + std::to_string(4 + r),
                      theirs);
  msg = error_of([&] { world.reduce_scatter(zeros({4 + r}), zeros({S * (4 + r)})); });
  expect_disagreement(msg, "rank " + std::to_string(r) + " is in reduce_scatter(sum, float32) of " +
                               std::to_string(S * (4 + r)),
                      "but rank " + std::to_string(other) + " passes " + std::to_string(S * (4 + other)) + " elements");
  expect_group_still_works();
}
