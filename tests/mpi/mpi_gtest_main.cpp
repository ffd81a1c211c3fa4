// main() of the multi-rank GoogleTest binaries that CTest runs under mpirun.
// Every rank runs every test and asserts; rank 0 prints the usual report, the
// other ranks print only their failures, prefixed with their rank. The exit
// code is the maximum over ranks, so mpirun fails when any rank failed.
// Tests must keep issuing the same collectives on every rank even when an
// EXPECT fails (prefer EXPECT to ASSERT before a collective); a rank that
// returns early leaves the others in a collective until the watchdog aborts
// the job (CTest sets LOOM_COLLECTIVE_TIMEOUT below its TIMEOUT).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "parallel/comm/distributed.h"
#include "tensor/ops.h"

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  // (UnitTest::current_test_info() would deadlock inside OnTestPartResult.)
  void OnTestStart(const ::testing::TestInfo& info) override {
    test_ = std::string(info.test_suite_name()) + "." + info.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s: %s:%d: Failure\n%s\n", rank_, test_.c_str(),
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }

 private:
  int rank_;
  std::string test_;
};

}  // namespace

int main(int argc, char** argv) {
  loom::parallel::init(argc, argv);
  loom::ops::set_num_threads(1);  // ranks share the machine's cores
  ::testing::InitGoogleTest(&argc, argv);
  int rank = loom::parallel::world().rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  int rc = RUN_ALL_TESTS();
  loom::Tensor worst = loom::from_vector<int32_t>({rc});
  loom::parallel::world().all_reduce(worst, loom::parallel::ReduceOp::Max);
  if (rank == 0 && rc == 0 && worst.item<int32_t>() != 0)
    std::fprintf(stderr, "[rank 0] passed here, but another rank failed: see its [rank N] lines\n");
  loom::parallel::finalize();
  return worst.item<int32_t>();
}
