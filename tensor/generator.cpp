#include "tensor/generator.h"

#include <cmath>
#include <type_traits>

#include "tensor/ops.h"

namespace loom {

static uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void Generator::manual_seed(uint64_t seed) {
  uint64_t x = seed;
  for (auto& w : s_) w = splitmix64(x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t Generator::next_u64() {  // xoshiro256** (Blackman & Vigna)
  uint64_t result = rotl(s_[1] * 5, 7) * 9;
  uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Generator::uniform() { return double(next_u64() >> 11) * 0x1.0p-53; }

double Generator::normal() {
  // Box-Muller, one value per call (no cached second value: the state is only s_).
  double u1 = uniform(), u2 = uniform();
  if (u1 < 1e-300) u1 = 1e-300;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

int64_t Generator::randint(int64_t low, int64_t high) {
  LOOM_CHECK(high > low, "randint: empty range [", low, ", ", high, ")");
  uint64_t span = uint64_t(high - low);
  return low + int64_t(next_u64() % span);  // modulo bias is < span / 2^64: negligible here
}

// Each draws into a float64 (int64) tensor made by empty(), so a shape too
// large for memory fails there with a message naming it, then converts.
template <class T, class Draw>
static Tensor drawn(const Shape& shape, DType dtype, Draw draw) {
  Tensor t = empty(shape, std::is_same_v<T, double> ? kFloat64 : kInt64);
  T* x = t.data<T>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) x[i] = draw();
  return ops::to(t, dtype);
}

Tensor randn(const Shape& shape, Generator& gen, DType dtype, double mean, double std) {
  return drawn<double>(shape, dtype, [&] { return mean + std * gen.normal(); });
}

Tensor rand(const Shape& shape, Generator& gen, DType dtype, double low, double high) {
  return drawn<double>(shape, dtype, [&] { return low + (high - low) * gen.uniform(); });
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, Generator& gen, DType dtype) {
  return drawn<int64_t>(shape, dtype, [&] { return gen.randint(low, high); });
}

}  // namespace loom
