// ProcessGroupByDevice (parallel/comm/process_group_by_device.h) on real
// ranks (CTest: 2 and 3). Both backends here are MPI groups of the same ranks,
// wrapped to count the operations each receives: host tensors must reach the
// host backend only, a barrier both, and a split must split both. (The CUDA
// half - CUDA tensors to the NCCL backend - needs a GPU: the routing is the
// same one-line test of the device.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/distributed.h"
#include "parallel/comm/process_group_by_device.h"

using namespace loom;
using namespace loom::parallel;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

namespace {

// Forwards to the group it owns and counts each operation it was given.
class CountingGroup final : public ProcessGroup {
 public:
  explicit CountingGroup(std::unique_ptr<ProcessGroup> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override {
    return ++ops, inner_->all_reduce_async(t, op);
  }
  std::shared_ptr<Work> reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) override {
    return ++ops, inner_->reduce_scatter_async(out, in, op);
  }
  std::shared_ptr<Work> all_gather_async(const Tensor& out, const Tensor& in) override {
    return ++ops, inner_->all_gather_async(out, in);
  }
  std::shared_ptr<Work> broadcast_async(const Tensor& t, int root) override {
    return ++ops, inner_->broadcast_async(t, root);
  }
  std::shared_ptr<Work> send_async(const Tensor& t, int dst, int tag) override {
    return ++ops, inner_->send_async(t, dst, tag);
  }
  std::shared_ptr<Work> recv_async(const Tensor& t, int src, int tag) override {
    return ++ops, inner_->recv_async(t, src, tag);
  }
  std::shared_ptr<Work> isend(const Tensor& t, int dst, int tag) override { return ++ops, inner_->isend(t, dst, tag); }
  std::shared_ptr<Work> irecv(const Tensor& t, int src, int tag) override { return ++ops, inner_->irecv(t, src, tag); }
  std::shared_ptr<Work> barrier_async() override { return ++ops, inner_->barrier_async(); }
  std::unique_ptr<ProcessGroup> split(int color, int key, const std::string& name) override {
    std::unique_ptr<ProcessGroup> g = inner_->split(color, key, name);
    return g ? std::make_unique<CountingGroup>(std::move(g)) : nullptr;
  }
  int ops = 0;

 private:
  std::unique_ptr<ProcessGroup> inner_;
};

// Two copies of the world, each its own communicator, as host and "cuda" backends.
struct Routed {
  CountingGroup* host;
  CountingGroup* cuda;
  std::unique_ptr<ProcessGroupByDevice> group;
};
Routed make_routed() {
  ProcessGroup& w = world();
  auto host = std::make_unique<CountingGroup>(w.split(0, w.rank(), "host"));
  auto cuda = std::make_unique<CountingGroup>(w.split(0, w.rank(), "cuda"));
  Routed r{host.get(), cuda.get(), nullptr};
  r.group = std::make_unique<ProcessGroupByDevice>(std::move(host), std::move(cuda), "both");
  return r;
}

}  // namespace

TEST(ProcessGroupByDevice, HostTensorsGoToTheHostBackendWithTheirResults) {
  Routed r = make_routed();
  ProcessGroup& g = *r.group;
  const int S = g.size(), me = g.rank();
  EXPECT_EQ(g.name(), "both");
  EXPECT_EQ(me, world().rank());

  Tensor t = full({4}, double(me + 1));
  g.all_reduce(t);  // 1 + 2 + ... + S
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(4, float(S * (S + 1) / 2)));
  Tensor mine = full({2}, double(me)), all = zeros({2 * S});
  g.all_gather(all, mine);
  EXPECT_EQ(all.to_vector<float>()[size_t(2 * (S - 1))], float(S - 1));
  Tensor out = zeros({2});
  g.reduce_scatter(out, full({2 * S}, 1.0));  // ones: each block sums to S
  EXPECT_EQ(out.to_vector<float>(), std::vector<float>(2, float(S)));
  Tensor b = full({3}, double(me));
  g.broadcast(b, S - 1);
  EXPECT_EQ(b.to_vector<float>(), std::vector<float>(3, float(S - 1)));
  if (me < 2 && S >= 2) {  // the pipeline's verbs between ranks 0 and 1
    Tensor x = full({5}, 7.0), y = zeros({5});
    if (me == 0) {
      g.isend(x, 1, 3)->wait();
      g.send(x, 1, 4);
    } else {
      g.irecv(y, 0, 3)->wait();
      g.recv(x, 0, 4);
      EXPECT_EQ(y.to_vector<float>(), std::vector<float>(5, 7.0f));
    }
  }
  EXPECT_EQ(r.cuda->ops, 0) << "a host tensor reached the CUDA backend";
  EXPECT_EQ(r.host->ops, me < 2 && S >= 2 ? 6 : 4);
  g.barrier();  // on both backends
  EXPECT_EQ(r.cuda->ops, 1);
}

TEST(ProcessGroupByDevice, SplitSplitsBothBackends) {
  Routed r = make_routed();
  const int me = r.group->rank();
  // Color by parity: {0, 2, ...} and {1, 3, ...}; rank 0 alone keeps out with color -1 when S > 2.
  const int color = world().size() > 2 && me == 0 ? -1 : me % 2;
  std::unique_ptr<ProcessGroup> half = r.group->split(color, me, "half");
  if (color < 0) {
    EXPECT_EQ(half, nullptr);
    return;
  }
  ASSERT_NE(half, nullptr);
  auto* routed = dynamic_cast<ProcessGroupByDevice*>(half.get());
  ASSERT_NE(routed, nullptr) << "a split of a ProcessGroupByDevice is one too";
  EXPECT_EQ(routed->host_backend().size(), routed->cuda_backend().size());
  EXPECT_EQ(routed->host_backend().rank(), routed->cuda_backend().rank());
  Tensor t = full({1}, 1.0);
  half->all_reduce(t);
  EXPECT_EQ(t.item<float>(), float(half->size()));
}

TEST(ProcessGroupByDevice, BackendsListingDifferentRanksAreRefused) {
  ProcessGroup& w = world();
  if (w.size() < 2) GTEST_SKIP() << "needs two ranks";
  auto host = w.split(0, w.rank(), "host");
  auto lone = w.split(w.rank(), 0, "alone");  // a group of one: rank 0 of 1
  EXPECT_THAT([&] { ProcessGroupByDevice g(std::move(host), std::move(lone), "both"); },
              ThrowsMessage<Error>(HasSubstr("ProcessGroupByDevice 'both': the host backend has this process as rank " +
                                             std::to_string(w.rank()) + " of " + std::to_string(w.size()) +
                                             ", the CUDA backend as rank 0 of 1")));
}
