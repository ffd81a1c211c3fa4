// ops::index_add sums each target's slices in index order (tensor/kernels/segment_sum.h,
// the math tensor/cuda/index_add.cu runs too): the bits of the plain loop
// `out[idx[j]] += src[j]` over j = 0, 1, ..., which is what MoE's permute and
// unpermute backwards (index_select's backward) give on one process. Values
// spread over six decades, so that any other order of the float adds shows.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <vector>

#include "tensor/ops.h"

using namespace loom;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

namespace {

Tensor spread(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  Tensor scale = ops::exp(ops::mul(rand(shape, gen, kFloat32), 14.0));  // 1 .. e^14
  return ops::mul(randn(shape, gen, kFloat32), scale);
}

// The loop index_add stands for, in fp32: [outer, n, inner] += src [outer, m, inner] at idx along dim.
std::vector<float> reference(const Shape& like, int64_t dim, const std::vector<int64_t>& idx, const Tensor& src) {
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= like[size_t(d)];
  for (size_t d = size_t(dim) + 1; d < like.size(); ++d) inner *= like[d];
  const int64_t n = like[size_t(dim)], m = int64_t(idx.size());
  const std::vector<float> s = ops::to(ops::contiguous(src), kFloat32).to_vector<float>();
  std::vector<float> out(size_t(outer * n * inner), 0.0f);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < m; ++j)
      for (int64_t k = 0; k < inner; ++k) out[size_t((o * n + idx[size_t(j)]) * inner + k)] += s[size_t((o * m + j) * inner + k)];
  return out;
}

// 60 indices into 7 targets, target 3 never hit: along dim 0 and dim 1 (outer 3), int64 and int32 indices.
std::vector<int64_t> repeated() {
  std::vector<int64_t> idx;
  for (int64_t j = 0; j < 60; ++j) idx.push_back((j * 5 + j / 7) % 6 + ((j * 5 + j / 7) % 6 >= 3));
  return idx;
}

}  // namespace

TEST(IndexAdd, SumsEachTargetsSlicesInIndexOrder) {
  const std::vector<int64_t> idx = repeated();
  const Tensor idx64 = from_vector(idx, {60});
  for (DType index_dtype : {kInt64, kInt32})
    for (int64_t dim : {0, 1}) {
      SCOPED_TRACE("dim " + std::to_string(dim) + " " + dtype_name(index_dtype));
      const Shape like = dim == 0 ? Shape{7, 4, 3} : Shape{3, 7, 4};
      const Tensor src = spread(dim == 0 ? Shape{60, 4, 3} : Shape{3, 60, 4}, 1 + uint64_t(dim));
      const Tensor out = ops::index_add(zeros(like), dim, ops::to(idx64, index_dtype), src);
      EXPECT_EQ(out.to_vector<float>(), reference(like, dim, idx, src));
    }
}

TEST(IndexAdd, SixteenBitSumsInFp32ThenRounds) {
  const std::vector<int64_t> idx = repeated();
  const Tensor src = ops::to(spread({60, 5}, 3), kBFloat16);
  const Tensor out = ops::index_add(zeros({7, 5}, kBFloat16), 0, from_vector(idx, {60}), src);
  ASSERT_EQ(out.dtype(), kBFloat16);
  const Tensor ref = ops::to(from_vector(reference({7, 5}, 0, idx, src), {7, 5}), kBFloat16);
  EXPECT_EQ(ops::to(out, kFloat32).to_vector<float>(), ops::to(ref, kFloat32).to_vector<float>());
}

TEST(IndexAdd, NoIndicesGiveZerosAndABadOneIsRefused) {
  const Tensor none = ops::index_add(zeros({3, 2}), 0, from_vector(std::vector<int64_t>{}, {0}), zeros({0, 2}));
  EXPECT_EQ(none.to_vector<float>(), std::vector<float>(6, 0.0f));
  EXPECT_THAT([] { ops::index_add(zeros({3, 2}), 0, from_vector(std::vector<int64_t>{0, 3}, {2}), zeros({2, 2})); },
              ThrowsMessage<Error>(HasSubstr("index_add: index 3 out of range for size 3")));
}
