// Seeded random generators, deterministic across runs and machines.
// Generator: xoshiro256** for bits, our own uniform/normal conversions
// (std::normal_distribution is not portable across standard libraries); it
// draws initial weights and batches, one value after another. Its 4-word
// state can be saved and restored, so data order resumes bit-exactly.
// PhiloxGenerator: the counter-based generator of dropout (kernels/philox.h),
// whose whole state is (seed, offset): any element of any call can be drawn
// by any thread, on the CPU or a GPU, with the same bits.
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

struct PhiloxGenerator {
  uint64_t seed = 0;
  uint64_t offset = 0;  // calls drawn so far: call k draws at counters (i / 4, k)

  // The offset of the next call (PyTorch's philox_engine_inputs, one offset per call).
  uint64_t next_offset() { return offset++; }
};

// Filled tensors (values drawn in row-major order, computed in double, rounded to dtype).
Tensor randn(const Shape& shape, Generator& gen, DType dtype = kFloat32, double mean = 0.0, double std = 1.0);
Tensor rand(const Shape& shape, Generator& gen, DType dtype = kFloat32, double low = 0.0, double high = 1.0);
Tensor randint(int64_t low, int64_t high, const Shape& shape, Generator& gen, DType dtype = kInt64);

}  // namespace loom
