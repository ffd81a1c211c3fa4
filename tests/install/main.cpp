// A program built against an installed loom (find_package(loom), loom::loom):
// [[1, 2], [3, 4]] x [[5, 6], [7, 8]] = [[19, 22], [43, 50]].
#include <cstdio>

#include "tensor/ops.h"

int main() {
  loom::Tensor a = loom::tensor({1, 2, 3, 4}, {2, 2}), b = loom::tensor({5, 6, 7, 8}, {2, 2});
  for (float v : loom::ops::matmul(a, b).to_vector<float>()) std::printf("%g ", double(v));
  std::printf("\n");
}
