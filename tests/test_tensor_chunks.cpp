// The chunk table of the one-launch AdamW (tensor/kernels/tensor_chunks.h), on
// the CPU: every element of every tensor in exactly one chunk, the chunk
// boundaries, tensors of 0, 1 and odd sizes. The GPU kernel that walks the
// table is tests/cuda/test_cuda_optim_multi_tensor.cpp's.
#include <gtest/gtest.h>

#include <vector>

#include "tensor/kernels/tensor_chunks.h"

using namespace loom;
using kernels::TensorChunk;
using kernels::tensor_chunks;

namespace {

// How many chunks cover each element of each tensor (1 everywhere when the table is right).
std::vector<std::vector<int>> coverage(const std::vector<int64_t>& numels, const std::vector<TensorChunk>& chunks) {
  std::vector<std::vector<int>> seen;
  for (int64_t n : numels) seen.emplace_back(size_t(n), 0);
  for (const TensorChunk& c : chunks) {
    EXPECT_GE(c.tensor, 0);
    EXPECT_LT(size_t(c.tensor), numels.size());
    EXPECT_GE(c.begin, 0);
    EXPECT_GE(c.size, 1);
    EXPECT_LE(c.begin + c.size, numels[size_t(c.tensor)]);
    for (int64_t i = c.begin; i < c.begin + c.size; ++i) ++seen[size_t(c.tensor)][size_t(i)];
  }
  return seen;
}

}  // namespace

TEST(TensorChunks, EveryElementInExactlyOneChunk) {
  for (int64_t chunk : {1, 2, 3, 4, 7, 64, 4096}) {
    const std::vector<int64_t> numels = {5, 0, 1, 3, 4096, 4097, 8191, 0, 129};
    SCOPED_TRACE(chunk);
    const std::vector<TensorChunk> chunks = tensor_chunks(numels, chunk);
    const std::vector<std::vector<int>> seen = coverage(numels, chunks);
    for (size_t t = 0; t < numels.size(); ++t)
      for (size_t i = 0; i < seen[t].size(); ++i) ASSERT_EQ(seen[t][i], 1) << "tensor " << t << " element " << i;
    int64_t want = 0;  // ceil(n / chunk) each: no empty or spare chunk
    for (int64_t n : numels) want += (n + chunk - 1) / chunk;
    EXPECT_EQ(int64_t(chunks.size()), want);
  }
}

TEST(TensorChunks, ChunkBoundariesAndOrder) {
  const std::vector<TensorChunk> c = tensor_chunks({5, 0, 3, 8, 1}, 4);
  const std::vector<std::vector<int64_t>> want = {{0, 0, 4}, {0, 4, 1}, {2, 0, 3}, {3, 0, 4}, {3, 4, 4}, {4, 0, 1}};
  ASSERT_EQ(c.size(), want.size());
  for (size_t i = 0; i < c.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(c[i].tensor, want[i][0]);  // tensor order, then element order; tensor 1 (empty) has none
    EXPECT_EQ(c[i].begin, want[i][1]);
    EXPECT_EQ(c[i].size, want[i][2]);
  }
}

TEST(TensorChunks, EmptyListsAndBadSizesRefused) {
  EXPECT_TRUE(tensor_chunks({}, 4).empty());
  EXPECT_TRUE(tensor_chunks({0, 0}, 4).empty());
  EXPECT_THROW(tensor_chunks({3}, 0), Error);
  EXPECT_THROW(tensor_chunks({-1}, 4), Error);
}
