// HooksTest: the hook points data parallelism is built on (DESIGN.md, issue #2).
//   - grad_accumulator(p)->register_hook: once per param per backward, after the
//     gradients of every use of p have been summed (DataParallelBucket's hook);
//   - register_post_accumulate_grad_hook: sees p with .grad set (DataParallelNaive);
//   - Engine::queue_callback: runs after every node and hook of the pass (where DP
//     waits for its in-flight all-reduces);
//   - a deterministic execution order, so that buckets become ready in the same
//     order on every rank;
//   - both registrations return a RemovableHandle: the hook lives as long as the
//     handle, so a data-parallel wrapper takes its hooks with it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "error_of.h"
#include "autograd/accumulate_grad.h"
#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/variable.h"
#include "parallel/data_parallel/data_parallel_bucket.h"
#include "parallel/data_parallel/data_parallel_naive.h"
#include "tensor/ops.h"

using namespace loom;
using namespace loom::autograd;

namespace {

Tensor param(std::initializer_list<double> v, Shape shape = {}) {
  Tensor t = tensor(v, std::move(shape), kFloat64);
  set_requires_grad(t);
  return t;
}

using loom::test::error_of;

}  // namespace

TEST(HooksTest, AccumulateGradHookFiresOncePerBackwardWithTheSummedGradient) {
  Tensor w = param({1, 2, 3});
  Tensor x1 = tensor({1, 1, 1}, {3}, kFloat64), x2 = tensor({10, 20, 30}, {3}, kFloat64);
  auto acc = grad_accumulator(w);  // held, as picotron holds grad_acc_fn
  int calls = 0;
  std::vector<double> seen;
  RemovableHandle hook = acc->register_hook([&](Tensor& p) {
    ++calls;
    seen = grad(p).to_vector<double>();
  });
  // w is used twice: the hook must see d/dw [sum(w*x1) + sum(w*x2)] = x1 + x2, once.
  backward(sum(w * x1) + sum(w * x2));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, (std::vector<double>{11, 21, 31}));

  // A new graph over the same param uses the same (held) node: the hook fires again,
  // and sees the gradient accumulated on top of the first.
  backward(sum(w * w));  // + 2w
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(seen, (std::vector<double>{13, 25, 37}));
}

TEST(HooksTest, GradAccumulatorIsTheSameNodeWhileItIsAlive) {
  Tensor w = param({1, 2});
  auto a1 = grad_accumulator(w);
  auto a2 = grad_accumulator(w);
  EXPECT_EQ(a1.get(), a2.get());
  EXPECT_EQ(a1->name(), "AccumulateGrad");
  EXPECT_TRUE(a1->variable.is_same(w));
  // Every use of w in a graph points at that node.
  Tensor y = w * 2.0, z = w + w;
  EXPECT_EQ(grad_fn(y)->next_edges.at(0).fn.get(), a1.get());
  EXPECT_EQ(grad_fn(z)->next_edges.at(0).fn.get(), a1.get());
  EXPECT_EQ(grad_fn(z)->next_edges.at(1).fn.get(), a1.get());
  EXPECT_EQ(grad_accumulator(w).get(), a1.get());
}

TEST(HooksTest, GradAccumulatorOfANonLeafOrAConstantIsAnError) {
  Tensor w = param({1, 2});
  EXPECT_NE(error_of([&] { grad_accumulator(w * 2.0); }).find("only leaf tensors"), std::string::npos);
  EXPECT_NE(error_of([] { grad_accumulator(zeros({2})); }).find("does not require grad"), std::string::npos);
}

TEST(HooksTest, PostAccumulateGradHookSeesTheParamWithItsGrad) {
  Tensor w = param({1, 2}), b = param({5});
  std::vector<std::string> log;
  auto acc = grad_accumulator(w);
  RemovableHandle acc_hook = acc->register_hook([&](Tensor& p) { log.push_back("acc hook " + grad(p).str()); });
  RemovableHandle post_hook = register_post_accumulate_grad_hook(w, [&](Tensor& p) {
    EXPECT_TRUE(p.is_same(w));  // the parameter itself, not a copy
    ASSERT_TRUE(grad(p).defined());
    log.push_back("post hook " + grad(p).str());
  });
  backward(sum(w * 3.0) + sum(b));
  // Both kinds of hook see the gradient; the accumulator hooks run first.
  EXPECT_EQ(log, (std::vector<std::string>{"acc hook tensor([3, 3], float64)", "post hook tensor([3, 3], float64)"}));
}

TEST(HooksTest, QueuedCallbackRunsAfterAllHooks) {
  // L = sum(a * x) + sum(b * x). The b branch was recorded last, so its nodes run first
  // (highest sequence_nr) and b's hook fires before a's; the callback queued by the
  // first hook still waits for the end of the pass.
  Tensor a = param({1, 2}), b = param({3, 4});
  Tensor x = tensor({1, 1}, {2}, kFloat64);
  std::vector<std::string> log;
  auto acc_a = grad_accumulator(a), acc_b = grad_accumulator(b);
  RemovableHandle hook_a = acc_a->register_hook([&](Tensor&) {
    log.push_back("hook a");
    if (log.size() == 1) Engine::queue_callback([&] { log.push_back("callback"); });
  });
  RemovableHandle hook_b = acc_b->register_hook([&](Tensor&) {
    log.push_back("hook b");
    if (log.size() == 1) Engine::queue_callback([&] { log.push_back("callback"); });
  });
  RemovableHandle post_a = register_post_accumulate_grad_hook(a, [&](Tensor&) { log.push_back("post a"); });
  Tensor la = sum(a * x);
  Tensor lb = sum(b * x);  // recorded after la
  backward(la + lb);
  EXPECT_EQ(log, (std::vector<std::string>{"hook b", "hook a", "post a", "callback"}));
}

TEST(HooksTest, CallbackQueuedInAHookRunsInTheSameBackwardOnly) {
  Tensor w = param({1});
  auto acc = grad_accumulator(w);
  int queued = 0, ran = 0;
  bool in_backward_during_callback = false;
  bool queue = true;
  RemovableHandle hook = acc->register_hook([&](Tensor&) {
    if (!queue) return;
    ++queued;
    Engine::queue_callback([&] {
      ++ran;
      in_backward_during_callback = Engine::in_backward();
    });
  });
  backward(sum(w * 2.0));
  EXPECT_EQ(queued, 1);
  EXPECT_EQ(ran, 1);  // ran before backward() returned
  EXPECT_TRUE(in_backward_during_callback);
  EXPECT_FALSE(Engine::in_backward());
  queue = false;
  backward(sum(w * 2.0));
  EXPECT_EQ(ran, 1);  // a callback runs once: the next pass starts with none queued
}

TEST(HooksTest, CallbackQueuedFromACallbackRunsToo) {
  Tensor w = param({1});
  auto acc = grad_accumulator(w);
  std::vector<std::string> log;
  RemovableHandle hook = acc->register_hook([&](Tensor&) {
    log.push_back("hook");
    Engine::queue_callback([&] {
      log.push_back("callback 1");
      Engine::queue_callback([&] {
        log.push_back("callback 2");
        Engine::queue_callback([&] { log.push_back("callback 3"); });
      });
    });
  });
  backward(sum(w));
  EXPECT_EQ(log, (std::vector<std::string>{"hook", "callback 1", "callback 2", "callback 3"}));
}

TEST(HooksTest, QueueCallbackOutsideABackwardIsAnError) {
  EXPECT_FALSE(Engine::in_backward());
  std::string msg = error_of([] { Engine::queue_callback([] {}); });
  EXPECT_NE(msg.find("queue_callback"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no backward pass"), std::string::npos) << msg;
}

// A small MLP-like graph; returns the names of the params in the order their
// accumulator hooks fired.
//
//   h1 = relu(x @ W1 + b1)        [4, 3] @ [3, 5]
//   h2 = relu(h1 @ W2 + b2)       [4, 5] @ [5, 5]    first use of W2
//   h3 = h2 @ W2                                     second use of W2 (shared)
//   ya = h3 @ Wa ; yb = h3 @ Wb   siblings, yb recorded last
//   p  = cat(c0, ..., c4)         five params joined by one op
//   L  = sum(ya * yb) + sum(p * p)
//
// Expected order, derived by hand from the engine's rule (a node runs once every
// gradient it will receive has arrived; among ready nodes the latest-recorded runs
// first; AccumulateGrad runs as soon as it is ready; ties in edge order):
//   - The last op is the final add; of its inputs sum(p * p) was recorded last, so
//     the cat branch goes first: c0, c1, c2, c3, c4 (one op: edge order).
//   - Then the MLP: yb's matmul (recorded after ya's) -> Wb, then ya's -> Wa;
//   - h3's matmul sends W2's first gradient, but W2 was also used earlier, so it
//     waits; b2 is reached first through the add, then h1 @ W2 completes W2;
//   - finally b1 and W1.
std::vector<std::string> hook_order_of_mlp() {
  Generator gen(3);
  auto p = [&](const Shape& s) {
    Tensor t = randn(s, gen, kFloat64);
    set_requires_grad(t);
    return t;
  };
  Tensor x = randn({4, 3}, gen, kFloat64);
  Tensor W1 = p({3, 5}), b1 = p({5}), W2 = p({5, 5}), b2 = p({5}), Wa = p({5, 2}), Wb = p({5, 2});
  Tensor c0 = p({2}), c1 = p({3}), c2 = p({1}), c3 = p({2}), c4 = p({1});
  std::vector<std::pair<std::string, Tensor>> params = {{"W1", W1}, {"b1", b1}, {"W2", W2}, {"b2", b2},
                                                        {"Wa", Wa}, {"Wb", Wb}, {"c0", c0}, {"c1", c1},
                                                        {"c2", c2}, {"c3", c3}, {"c4", c4}};
  std::vector<std::string> order;
  std::vector<std::shared_ptr<AccumulateGrad>> held;
  std::vector<RemovableHandle> hooks;
  for (auto& [name, t] : params) {
    held.push_back(grad_accumulator(t));
    hooks.push_back(held.back()->register_hook([&order, n = name](Tensor&) { order.push_back(n); }));
  }
  Tensor h1 = relu(matmul(x, W1) + b1);
  Tensor h2 = relu(matmul(h1, W2) + b2);
  Tensor h3 = matmul(h2, W2);
  Tensor ya = matmul(h3, Wa);
  Tensor yb = matmul(h3, Wb);
  Tensor pc = cat({c0, c1, c2, c3, c4}, 0);
  Tensor l_mlp = sum(ya * yb);
  Tensor l_cat = sum(pc * pc);  // recorded after l_mlp
  backward(l_mlp + l_cat);
  return order;
}

TEST(HooksTest, ExecutionOrderIsDeterministicAndReverseOfUse) {
  const std::vector<std::string> expected = {"c0", "c1", "c2", "c3", "c4", "Wb", "Wa", "b2", "W2", "b1", "W1"};
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE(::testing::Message() << "run " << run);
    EXPECT_EQ(hook_order_of_mlp(), expected);
  }
}

// ---- RemovableHandle ----------------------------------------------------------

TEST(HooksTest, DestroyingTheHandleRemovesTheHook) {
  Tensor w = param({1, 2});
  int acc_calls = 0, post_calls = 0;
  {
    RemovableHandle acc_hook = grad_accumulator(w)->register_hook([&](Tensor&) { ++acc_calls; });
    RemovableHandle post_hook = register_post_accumulate_grad_hook(w, [&](Tensor&) { ++post_calls; });
    backward(sum(w * 2.0));
    EXPECT_EQ(acc_calls, 1);
    EXPECT_EQ(post_calls, 1);
  }
  backward(sum(w * 2.0));
  EXPECT_EQ(acc_calls, 1);  // the gradient no longer triggers them
  EXPECT_EQ(post_calls, 1);
  EXPECT_EQ(grad(w).to_vector<double>(), (std::vector<double>{4, 4}));  // accumulation itself goes on
  EXPECT_EQ(meta(w).post_accumulate_grad_hooks->size(), 0u);
}

TEST(HooksTest, RemoveUnregistersAtOnceAndTwiceIsHarmless) {
  Tensor w = param({1});
  int calls = 0;
  RemovableHandle h = register_post_accumulate_grad_hook(w, [&](Tensor&) { ++calls; });
  EXPECT_TRUE(h.active());
  h.remove();
  EXPECT_FALSE(h.active());
  h.remove();
  backward(sum(w * 2.0));
  EXPECT_EQ(calls, 0);
}

// Nothing but the handle holds w's AccumulateGrad node between the two graphs:
// the handle keeps it (and so the hook) alive, as picotron's grad_accs list does.
TEST(HooksTest, AccumulatorHookHandleKeepsTheNodeAlive) {
  Tensor w = param({1, 2});
  int calls = 0;
  RemovableHandle h = grad_accumulator(w)->register_hook([&](Tensor&) { ++calls; });
  backward(sum(w * 2.0));
  backward(sum(w * 3.0));  // a new graph over w, built after the first was freed
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(grad_accumulator(w)->num_hooks(), 1u);
}

TEST(HooksTest, HandlesCanBeMovedAndTheLastOwnerRemovesTheHook) {
  Tensor w = param({1});
  int calls = 0, replaced_calls = 0;
  RemovableHandle outer;
  EXPECT_FALSE(outer.active());
  {
    RemovableHandle inner = register_post_accumulate_grad_hook(w, [&](Tensor&) { ++calls; });
    outer = std::move(inner);
    EXPECT_FALSE(inner.active());  // NOLINT(bugprone-use-after-move): moved-from is empty
    EXPECT_TRUE(outer.active());
  }  // the moved-from handle goes: the hook stays
  backward(sum(w * 1.0));
  EXPECT_EQ(calls, 1);

  std::vector<RemovableHandle> owners;
  owners.push_back(std::move(outer));
  owners.reserve(16);  // reallocation moves the handle again
  RemovableHandle moved_again(std::move(owners[0]));
  backward(sum(w * 1.0));
  EXPECT_EQ(calls, 2);

  // Move-assigning over a live handle removes the hook it held.
  RemovableHandle replaced = register_post_accumulate_grad_hook(w, [&](Tensor&) { ++replaced_calls; });
  replaced = std::move(moved_again);
  backward(sum(w * 1.0));
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(replaced_calls, 0);

  owners.clear();
  replaced = RemovableHandle();
  backward(sum(w * 1.0));
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(meta(w).post_accumulate_grad_hooks->size(), 0u);
}

TEST(HooksTest, AHookMayRemoveItselfWhileHooksRun) {
  Tensor w = param({1});
  int once = 0, always = 0;
  RemovableHandle self;
  self = register_post_accumulate_grad_hook(w, [&](Tensor&) {
    ++once;
    self.remove();
  });
  RemovableHandle other = register_post_accumulate_grad_hook(w, [&](Tensor&) { ++always; });
  backward(sum(w * 1.0));
  backward(sum(w * 1.0));
  EXPECT_EQ(once, 1);
  EXPECT_EQ(always, 2);
}

// ---- the data-parallel wrappers take their hooks with them --------------------

// A data-parallel group of one rank, in process: every collective is the
// identity, and all-reduces and reduce-scatters are counted, so a test sees
// whether a hook still launches any.
class OneRankGroup : public parallel::ProcessGroup {
 public:
  int reductions = 0;
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  std::shared_ptr<parallel::Work> all_reduce_async(const Tensor&, parallel::ReduceOp) override {
    ++reductions;
    return done();
  }
  std::shared_ptr<parallel::Work> reduce_scatter_async(const Tensor& out, const Tensor& in,
                                                       parallel::ReduceOp) override {
    ++reductions;
    ops::copy_(out, in);
    return done();
  }
  std::shared_ptr<parallel::Work> all_gather_async(const Tensor& out, const Tensor& in) override {
    ops::copy_(out, in);
    return done();
  }
  std::shared_ptr<parallel::Work> broadcast_async(const Tensor&, int) override { return done(); }
  std::shared_ptr<parallel::Work> send_async(const Tensor&, int, int) override { throw Error("send: one rank"); }
  std::shared_ptr<parallel::Work> recv_async(const Tensor&, int, int) override { throw Error("recv: one rank"); }
  std::shared_ptr<parallel::Work> barrier_async() override { return done(); }
  std::unique_ptr<parallel::ProcessGroup> split(int, int, const std::string&) override {
    throw Error("split: one rank");
  }

 private:
  struct Done : parallel::Work {
    void wait() override {}
    bool is_completed() override { return true; }
  };
  static std::shared_ptr<parallel::Work> done() { return std::make_shared<Done>(); }
  std::string name_ = "dp";
};

TEST(HooksTest, DestroyedDataParallelNaiveLeavesNoHook) {
  Tensor w = param({1, 2});
  OneRankGroup dp;
  {
    parallel::DataParallelNaive ddp(parallel::NamedParams{{"w", w}}, dp);
    backward(sum(w * 3.0));
    EXPECT_EQ(dp.reductions, 1);
    EXPECT_EQ(meta(w).post_accumulate_grad_hooks->size(), 1u);
    ddp.zero_grad();
  }
  EXPECT_EQ(meta(w).post_accumulate_grad_hooks->size(), 0u);
  backward(sum(w * 3.0));  // backward still works, and all-reduces nothing
  EXPECT_EQ(dp.reductions, 1);
  EXPECT_EQ(grad(w).to_vector<double>(), (std::vector<double>{3, 3}));
}

TEST(HooksTest, DestroyedDataParallelBucketLeavesNoHook) {
  Tensor w = param({1, 2});
  auto acc = grad_accumulator(w);
  OneRankGroup dp;
  {
    parallel::DataParallelBucket ddp(parallel::NamedParams{{"w", w}}, dp);
    EXPECT_EQ(acc->num_hooks(), 1u);
    backward(sum(w * 3.0));
    EXPECT_EQ(dp.reductions, 1);  // the one bucket
    EXPECT_EQ(ddp.main_grad(w).to_vector<float>(), (std::vector<float>{3, 3}));
    ddp.reset();
  }
  EXPECT_EQ(acc->num_hooks(), 0u);
  // Its hook would move .grad into the freed buffer and drop it; without the
  // hook .grad stays where AccumulateGrad put it.
  backward(sum(w * 3.0));
  EXPECT_EQ(dp.reductions, 1);
  EXPECT_EQ(grad(w).to_vector<double>(), (std::vector<double>{3, 3}));
}
