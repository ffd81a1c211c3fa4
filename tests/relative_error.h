// relative_error(got, ref): max |got - ref| / max |ref|, in double, whatever
// the dtypes (bf16, fp16 and fp32 are widened first). Rounding shows as ~1e-7
// in fp32 and ~4e-3 in bf16, whatever the scale of the values.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/ops.h"

namespace loom::test {

inline double relative_error(const Tensor& got, const Tensor& ref) {
  EXPECT_EQ(got.shape(), ref.shape());
  std::vector<double> a = ops::to(got, kFloat64).to_vector<double>(), b = ops::to(ref, kFloat64).to_vector<double>();
  double max_diff = 0, max_ref = 1e-30;  // an all-zero ref: any difference is huge
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(a[i] - b[i]));
    max_ref = std::max(max_ref, std::abs(b[i]));
  }
  return max_diff / max_ref;
}

}  // namespace loom::test
