// The start-up handshake (parallel/comm/handshake.h) on real ranks (CTest runs
// it on 2 and 3): equal fields pass; a field that differs on one rank throws on
// every rank, naming the field, each value and the ranks that hold it, and
// each rank's host (here all on this machine; tests/multihost: on several).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "parallel/comm/distributed.h"
#include "parallel/comm/handshake.h"

using namespace loom;
using namespace loom::parallel;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::ThrowsMessage;

TEST(Handshake, EqualFieldsPass) {
  EXPECT_NO_THROW(check_ranks_agree(world(), {{"layers", "4"}, {"dtype", "bf16"}, {"note", "a=b\nc\\d"}}));
}

TEST(Handshake, AFieldThatDiffersOnOneRankThrowsOnEveryRankNamingIt) {
  if (world().size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  const int last = world().size() - 1;
  const std::string layers = world().rank() == last ? "3" : "2";
  std::string want_others = world().size() == 2 ? "'2' on rank 0" : "'2' on ranks 0, 1";
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof host - 1), 0);
  const std::string all_ranks = world().size() == 2 ? "ranks 0, 1" : "ranks 0, 1, 2";
  EXPECT_THAT([&] { check_ranks_agree(world(), {{"layers", layers}, {"heads", "4"}}); },
              ThrowsMessage<Error>(AllOf(HasSubstr("ranks disagree on the run config (group world"),
                                         HasSubstr("layers: " + want_others + "; '3' on rank " + std::to_string(last)),
                                         HasSubstr("\n  hosts: " + all_ranks + " on " + host), Not(HasSubstr("heads")))));
}

TEST(Handshake, AFieldOneRankLacksIsNamedAsMissing) {
  if (world().size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  RunFields fields{{"layers", "2"}};
  if (world().rank() == 1) fields.push_back({"corpus hash", fingerprint("abc", 3)});
  EXPECT_THAT([&] { check_ranks_agree(world(), fields, "data"); },
              ThrowsMessage<Error>(AllOf(HasSubstr("ranks disagree on the data"),
                                         HasSubstr("corpus hash: "), HasSubstr("(missing) on rank"),
                                         HasSubstr("'" + fingerprint("abc", 3) + "' on rank 1"))));
}

TEST(Handshake, FingerprintIsFnv1a) {
  // FNV-1a 64 of "" is the offset basis; of "a" the published test vector.
  EXPECT_EQ(fingerprint("", 0), "cbf29ce484222325");
  EXPECT_EQ(fingerprint("a", 1), "af63dc4c8601ec8c");
  EXPECT_NE(fingerprint("abc", 3), fingerprint("abd", 3));
}
