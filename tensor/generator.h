// A seeded random generator, deterministic across runs and machines: xoshiro256**
// for bits, our own uniform/normal conversions (std::normal_distribution is not
// portable across standard libraries). Its 4-word state can be saved and
// restored, so data order resumes bit-exactly from a checkpoint.
#pragma once

#include <array>
#include <cstdint>

#include "tensor/tensor.h"

namespace loom {

class Generator {
 public:
  explicit Generator(uint64_t seed = 1337) { manual_seed(seed); }
  void manual_seed(uint64_t seed);

  uint64_t next_u64();
  double uniform();            // [0, 1), 53 random bits
  double normal();             // N(0, 1), Box-Muller
  int64_t randint(int64_t low, int64_t high);  // [low, high)

  std::array<uint64_t, 4> state() const { return s_; }
  void set_state(const std::array<uint64_t, 4>& s) { s_ = s; }

 private:
  std::array<uint64_t, 4> s_{};
};

// Filled tensors (values drawn in row-major order, computed in double, rounded to dtype).
Tensor randn(const Shape& shape, Generator& gen, DType dtype = kFloat32, double mean = 0.0, double std = 1.0);
Tensor rand(const Shape& shape, Generator& gen, DType dtype = kFloat32, double low = 0.0, double high = 1.0);
Tensor randint(int64_t low, int64_t high, const Shape& shape, Generator& gen, DType dtype = kInt64);

}  // namespace loom
