// Dropout's counter-based generator (tensor/kernels/philox.h) and the masks it
// draws: Philox4x32-10 against Random123's published answers, the keep rate,
// masks that depend only on (seed, offset, element) - the same for any thread
// split and any tensor length - the gradient, and the offset that train_gpt's
// checkpoints carry (nn/dropout.h). The GPU draws the same masks
// (tests/cuda/test_cuda_dropout.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gradcheck.h"
#include "nn/dropout.h"
#include "nn/gpt.h"
#include "tensor/kernels/philox.h"
#include "tensor/ops.h"

using namespace loom;
using loom::test::gradcheck;

namespace {

std::vector<float> mask_of(int64_t n, double p, uint64_t seed, uint64_t offset) {
  return ops::dropout_mask({n}, kFloat32, kCPU, p, seed, offset).to_vector<float>();
}

double kept_fraction(const std::vector<float>& m, size_t first = 0, size_t step = 1) {
  int64_t kept = 0, total = 0;
  for (size_t i = first; i < m.size(); i += step, ++total) kept += m[i] != 0.0f;
  return double(kept) / double(total);
}

}  // namespace

// Known-answer vectors: the three "philox4x32 10" lines of Random123's
// tests/kat_vectors (https://github.com/DEShawResearch/random123, tests/kat_vectors;
// columns: counter[4] key[2] expected[4], hex words).
//   philox4x32 10 00000000 00000000 00000000 00000000 00000000 00000000   6627e8d5 e169c58d bc57ac4c 9b00dbd8
//   philox4x32 10 ffffffff ffffffff ffffffff ffffffff ffffffff ffffffff   408f276d 41c83b0e a20bc7c6 6d5451fd
//   philox4x32 10 243f6a88 85a308d3 13198a2e 03707344 a4093822 299f31d0   d16cfe09 94fdcceb 5001e420 24126ea1
TEST(Philox, MatchesRandom123KnownAnswers) {
  struct Kat {
    kernels::Philox4 ctr;
    uint32_t k0, k1;
    kernels::Philox4 expected;
  };
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       0xffffffff,
       0xffffffff,
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       0xa4093822,
       0x299f31d0,
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Kat& k : kats) {
    kernels::Philox4 got = kernels::philox4x32_10(k.ctr, k.k0, k.k1);
    for (int j = 0; j < 4; ++j) EXPECT_EQ(got.w[j], k.expected.w[j]) << "word " << j << " of ctr " << k.ctr.w[0];
  }
  // philox_block lays (block, offset) and seed out as the counter's and key's words, low word first.
  kernels::Philox4 b = kernels::philox_block(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull);
  EXPECT_EQ(b.w[0], 0xd16cfe09u);
  EXPECT_EQ(b.w[3], 0x24126ea1u);
}

TEST(Philox, ThresholdIsFloorOfPTimesTwoToThe32) {
  EXPECT_EQ(kernels::dropout_threshold(0.0), 0u);
  EXPECT_EQ(kernels::dropout_threshold(0.25), 0x40000000u);
  EXPECT_EQ(kernels::dropout_threshold(0.5), 0x80000000u);
  EXPECT_EQ(kernels::dropout_threshold(std::nextafter(1.0, 0.0)), 0xFFFFFFFFu);
  EXPECT_TRUE(kernels::dropout_keeps(0x80000000u, 0x80000000u));
  EXPECT_FALSE(kernels::dropout_keeps(0x7FFFFFFFu, 0x80000000u));
}

// 2^20 draws: the kept fraction's standard deviation is sqrt(p (1 - p) / n) <= 4.9e-4
// (1e-3 per word lane); 5 of them is the tolerance. Each lane (word i % 4 of a
// block) is checked alone, so a lane that always kept or always dropped shows.
TEST(Dropout, KeepRateIsOneMinusPInEveryWordLane) {
  const int64_t n = int64_t(1) << 20;
  for (double p : {0.1, 0.5, 0.9}) {
    std::vector<float> m = mask_of(n, p, 1234, 0);
    EXPECT_NEAR(kept_fraction(m), 1 - p, 5 * std::sqrt(p * (1 - p) / double(n))) << "p " << p;
    for (size_t lane = 0; lane < 4; ++lane)
      EXPECT_NEAR(kept_fraction(m, lane, 4), 1 - p, 5 * std::sqrt(p * (1 - p) / double(n / 4)))
          << "p " << p << ", lane " << lane;
    for (float v : m) ASSERT_TRUE(v == 0.0f || v == float(1 / (1 - p))) << v;
  }
}

// Two offsets (two calls of one layer) and two seeds (two layers) must draw
// independent masks: agreement is p^2 + (1 - p)^2 = 0.5 at p = 0.5, not 1.
TEST(Dropout, OffsetsAndSeedsDrawIndependentMasks) {
  const int64_t n = int64_t(1) << 18;
  auto agreement = [&](const std::vector<float>& a, const std::vector<float>& b) {
    int64_t same = 0;
    for (size_t i = 0; i < a.size(); ++i) same += (a[i] != 0) == (b[i] != 0);
    return double(same) / double(a.size());
  };
  const double tol = 5 * std::sqrt(0.25 / double(n));
  EXPECT_NEAR(agreement(mask_of(n, 0.5, 7, 0), mask_of(n, 0.5, 7, 1)), 0.5, tol);
  EXPECT_NEAR(agreement(mask_of(n, 0.5, 7, 0), mask_of(n, 0.5, 8, 0)), 0.5, tol);
  EXPECT_NEAR(agreement(mask_of(n, 0.5, 7, 0), mask_of(n, 0.5, uint64_t(7) << 32, 0)), 0.5, tol);  // key's high word
  EXPECT_NEAR(agreement(mask_of(n, 0.5, 7, 0), mask_of(n, 0.5, 7, uint64_t(1) << 32)), 0.5, tol);  // ctr's high word
}

// Element i's mask is a function of (seed, offset, i) alone: a shorter tensor
// gets a prefix of a longer one's mask, and 1 or 2 threads the same bits.
TEST(Dropout, MaskDependsOnlyOnSeedOffsetAndElement) {
  const int64_t n = 100003;  // > 2 x 4096 blocks: parallel_for splits it over 2 threads; a partial last block
  std::vector<float> longer = mask_of(n, 0.3, 99, 4);
  std::vector<float> shorter = mask_of(4097, 0.3, 99, 4);
  EXPECT_EQ(shorter, std::vector<float>(longer.begin(), longer.begin() + 4097));
  const int before = ops::get_num_threads();
  ops::set_num_threads(1);
  std::vector<float> one = mask_of(n, 0.3, 99, 4);
  ops::set_num_threads(2);
  std::vector<float> two = mask_of(n, 0.3, 99, 4);
  ops::set_num_threads(before);
  EXPECT_EQ(one, two);
  EXPECT_EQ(one, longer);
  // Shape does not matter either, only the element's row-major index.
  EXPECT_EQ(ops::dropout_mask({7, 11}, kFloat32, kCPU, 0.3, 99, 4).to_vector<float>(),
            std::vector<float>(longer.begin(), longer.begin() + 77));
}

TEST(Dropout, EachCallTakesTheNextOffset) {
  PhiloxGenerator g{5};
  Tensor x = full({1000}, 1.0);
  auto first = ops::dropout(x, 0.5, g).second.to_vector<float>();
  auto second = ops::dropout(x, 0.5, g).second.to_vector<float>();
  EXPECT_EQ(g.offset, 2u);
  EXPECT_EQ(first, mask_of(1000, 0.5, 5, 0));
  EXPECT_EQ(second, mask_of(1000, 0.5, 5, 1));
  PhiloxGenerator resumed{5, 1};  // the state after one call, as a checkpoint restores it
  EXPECT_EQ(ops::dropout(x, 0.5, resumed).second.to_vector<float>(), second);
}

TEST(Dropout, GradientIsTheMask) {
  for (double p : {0.1, 0.5}) {
    Tensor a = test::leaf(test::randn64({3, 8}, 11));
    // A fresh generator per evaluation: gradcheck evaluates f many times, on one mask.
    auto f = [p](const autograd::TensorList& x) {
      PhiloxGenerator g{21};
      return autograd::dropout(x[0], p, g);
    };
    EXPECT_TRUE(gradcheck(f, {a})) << "p " << p;
  }
}

// nn::Dropout layers of a GPT: seeds from the config's seed (a rebuilt model
// draws the same), one offset per training call, and the helpers train_gpt's
// checkpoints use to save and restore that offset.
TEST(Dropout, GptLayersShareOneOffsetThatACheckpointRestores) {
  nn::GPTConfig cfg{11, 8, 2, 2, 8, 0.2, 3};
  nn::GPT a(cfg), b(cfg);
  Tensor idx = ops::to(from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}, {1, 8}), kInt64);
  a.forward(idx);
  a.forward(idx);
  EXPECT_EQ(nn::dropout_offset(a), 2u);
  EXPECT_EQ(nn::dropout_offset(b), 0u);
  nn::set_dropout_offset(b, nn::dropout_offset(a));
  EXPECT_EQ(a.forward(idx).to_vector<float>(), b.forward(idx).to_vector<float>());  // the same third masks
  a.eval();
  a.forward(idx);  // eval draws nothing
  EXPECT_EQ(nn::dropout_offset(a), 3u);
  a.train();
  a.embedding()->drop->forward(full({2}, 1.0));  // one layer ran once more: no single offset describes the model
  EXPECT_THROW(nn::dropout_offset(a), Error);
}
