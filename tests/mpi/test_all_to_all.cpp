// ProcessGroup::all_to_all_v on the MPI backend, and its autograd function
// (parallel/expert_parallel/all_to_all.h), run by CTest on 1, 2 and 4 ranks.
// Rank r sends rank p a block of rows(r, p) = (r + p) % 3 rows (some empty),
// each row [v, v + 1] with v = 32 s + 8 p + 2 i (source s, destination p, row i):
// small integers, exact in every dtype, so every received value is a closed form.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/variable.h"
#include "parallel/comm/distributed.h"
#include "parallel/expert_parallel/all_to_all.h"
#include "tensor/ops.h"

using namespace loom;
using namespace loom::parallel;

namespace {

int64_t rows(int s, int p) { return (s + p) % 3; }

// What rank s sends, [Σ_p rows(s, p), 2], and its splits.
Tensor sent_by(int s, int S, DType dt) {
  std::vector<double> v;
  for (int p = 0; p < S; ++p)
    for (int64_t i = 0; i < rows(s, p); ++i)
      for (int k = 0; k < 2; ++k) v.push_back(32.0 * s + 8.0 * p + 2.0 * double(i) + k);
  return ops::to(from_vector(v, {int64_t(v.size() / 2), 2}), dt);
}

std::vector<int64_t> splits(int r, int S, bool input) {
  std::vector<int64_t> out;
  for (int q = 0; q < S; ++q) out.push_back(input ? rows(r, q) : rows(q, r));
  return out;
}

}  // namespace

TEST(AllToAllV, EachRankGetsEveryRanksBlockForIt) {
  ProcessGroup& world = parallel::world();
  const int r = world.rank(), S = world.size();
  for (DType dt : {kFloat64, kFloat32, kBFloat16, kInt64}) {
    const Tensor in = sent_by(r, S, dt);
    const std::vector<int64_t> out_splits = splits(r, S, false);
    int64_t n = 0;
    for (int64_t k : out_splits) n += k;
    Tensor out = empty({n, 2}, dt);
    world.all_to_all_v(out, in, out_splits, splits(r, S, true));
    std::vector<double> want;
    for (int s = 0; s < S; ++s)
      for (int64_t i = 0; i < rows(s, r); ++i)
        for (int k = 0; k < 2; ++k) want.push_back(32.0 * s + 8.0 * r + 2.0 * double(i) + k);
    EXPECT_EQ(ops::to(out, kFloat64).to_vector<double>(), want) << dtype_name(dt);
  }
}

// Every rank sends its 2 rows to rank 0: the others receive none (an empty output, rows of 3).
TEST(AllToAllV, ARankMayReceiveNoRows) {
  ProcessGroup& world = parallel::world();
  const int r = world.rank(), S = world.size();
  const Tensor in = from_vector(std::vector<float>{float(r), 1, 2, float(r), 3, 4}, {2, 3});
  std::vector<int64_t> to_rank0(size_t(S), 0), received(size_t(S), 0);
  to_rank0[0] = 2;
  if (r == 0) received.assign(size_t(S), 2);
  Tensor out = empty({r == 0 ? 2 * int64_t(S) : 0, 3});
  world.all_to_all_v(out, in, received, to_rank0);
  ASSERT_EQ(out.size(0), r == 0 ? 2 * S : 0);
  const std::vector<float> got = out.to_vector<float>();
  for (int s = 0; r == 0 && s < S; ++s) EXPECT_EQ(got[size_t(6 * s)], float(s)) << "from rank " << s;
}

// The gradient of each received row comes back to the rank and the row it was sent from: with
// loss = Σ_rows (receiver + 1) · |y|² / 2, d loss / d x for the rows sent to rank p is (p + 1) · x.
TEST(AllToAllV, BackwardIsTheReverseAllToAll) {
  ProcessGroup& world = parallel::world();
  const int r = world.rank(), S = world.size();
  const Tensor x = sent_by(r, S, kFloat64);
  autograd::set_requires_grad(x, true);
  const Tensor y = all_to_all(x, world, splits(r, S, false), splits(r, S, true));
  const Tensor loss = autograd::mul(autograd::sum(autograd::mul(y, y)), 0.5 * double(r + 1));
  autograd::backward(loss);
  std::vector<double> want;
  const std::vector<double> xs = x.to_vector<double>();
  size_t at = 0;
  for (int p = 0; p < S; ++p)
    for (int64_t i = 0; i < 2 * rows(r, p); ++i, ++at) want.push_back(double(p + 1) * xs[at]);
  EXPECT_EQ(autograd::grad(x).to_vector<double>(), want);
}

TEST(AllToAllV, BadSplitsAreRefusedBeforeAnyCommunication) {
  ProcessGroup& world = parallel::world();
  const int S = world.size();
  const Tensor in = zeros({3, 2}), out = zeros({3, 2});
  std::vector<int64_t> three(size_t(S), 0);
  three[0] = 3;
  std::string e;
  try {
    world.all_to_all_v(out, in, three, std::vector<int64_t>(size_t(S), 0));
  } catch (const Error& err) {
    e = err.what();
  }
  EXPECT_NE(e.find("all_to_all_v: the input splits sum to 0 rows, the input"), std::string::npos) << e;
  try {
    world.all_to_all_v(out, in, three, std::vector<int64_t>(size_t(S + 1), 0));
    e = "(no error)";
  } catch (const Error& err) {
    e = err.what();
  }
  EXPECT_NE(e.find(std::to_string(S + 1) + " input splits for a group of " + std::to_string(S) + " ranks"),
            std::string::npos) << e;
}
