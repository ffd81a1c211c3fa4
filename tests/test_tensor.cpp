// TensorTest: the tensor layer's data model, as a specification.
//   dtypes -> bf16/fp16 rounding -> creation -> random -> conversion -> views ->
//   memory counters -> printing -> errors.
// The ops (elementwise, reductions, matmul, nn ops) are specified in
// test_tensor_ops.cpp. Expected values are worked out by hand or by a closed
// form written here (IEEE bit patterns, std::ldexp), never copied from a run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>

#include "tensor/cuda/cuda.h"
#include "tensor/generator.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "error_of.h"

using namespace loom;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

namespace {

uint16_t bf16_bits(float f) { return float_to_bf16(f).bits; }
uint16_t fp16_bits(float f) { return float_to_fp16(f).bits; }
float two_pow(int e) { return std::ldexp(1.0f, e); }

// [0, 1, 2, ...] as float32 in the given shape.
Tensor counting(const Shape& shape) { return ops::view(arange(0, double(numel_of(shape))), shape); }

int64_t live_bytes() { return memory_stats().live_bytes; }

// Closed-form value of a binary16 bit pattern: (-1)^s 2^(e-15) (1 + m/1024), or
// m 2^-24 when subnormal.
double fp16_value_ref(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double mag = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(1.0 + m / 1024.0, e - 15);
  return s ? -mag : mag;
}

// Round-to-nearest-even of f onto a binary format with `mant_bits` fraction
// bits, smallest normal exponent `emin` and largest finite value `max_finite`,
// done in double with std::nearbyint (whose default mode is to-nearest-even).
double round_ref(double f, int mant_bits, int emin, double max_finite) {
  if (f == 0) return f;
  int e;
  std::frexp(std::abs(f), &e);  // |f| = m 2^e, m in [0.5, 1): leading bit is 2^(e-1)
  double ulp = std::ldexp(1.0, std::max(e - 1, emin) - mant_bits);
  double r = std::nearbyint(f / ulp) * ulp;
  return std::abs(r) > max_finite ? std::copysign(std::numeric_limits<double>::infinity(), f) : r;
}
double bf16_round_ref(float f) { return round_ref(f, 7, -126, std::ldexp(2.0 - std::ldexp(1.0, -7), 127)); }
double fp16_round_ref(float f) { return round_ref(f, 10, -14, 65504.0); }

}  // namespace

// ---- dtypes -----------------------------------------------------------------------

TEST(DType, ElementSizesAreTheStorageWidths) {
  EXPECT_EQ(element_size(kFloat64), 8u);
  EXPECT_EQ(element_size(kFloat32), 4u);
  EXPECT_EQ(element_size(kBFloat16), 2u);
  EXPECT_EQ(element_size(kFloat16), 2u);
  EXPECT_EQ(element_size(kInt32), 4u);
  EXPECT_EQ(element_size(kInt64), 8u);
}

TEST(DType, NamesRoundTripThroughDtypeFromName) {
  for (DType t : {kFloat64, kFloat32, kBFloat16, kFloat16, kInt32, kInt64})
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t) << dtype_name(t);
  EXPECT_STREQ(dtype_name(kFloat32), "float32");
  EXPECT_STREQ(dtype_name(kBFloat16), "bfloat16");
  EXPECT_STREQ(dtype_name(kFloat16), "float16");
  EXPECT_STREQ(dtype_name(kInt64), "int64");
}

TEST(DType, ShortAliasesAreAccepted) {
  EXPECT_EQ(dtype_from_name("fp32"), kFloat32);
  EXPECT_EQ(dtype_from_name("bf16"), kBFloat16);
  EXPECT_EQ(dtype_from_name("fp16"), kFloat16);
  EXPECT_EQ(dtype_from_name("fp64"), kFloat64);
}

TEST(DType, UnknownNameThrowsListingTheValidNames) {
  EXPECT_THAT([] { dtype_from_name("float8"); },
              ThrowsMessage<Error>(AllOf(HasSubstr("unknown dtype 'float8'"), HasSubstr("bfloat16"))));
}

TEST(DType, CategoriesSplitFloatingHalfAndInteger) {
  EXPECT_TRUE(is_floating(kFloat64) && is_floating(kBFloat16) && is_floating(kFloat16));
  EXPECT_FALSE(is_floating(kInt32) || is_floating(kInt64));
  EXPECT_TRUE(is_half(kBFloat16) && is_half(kFloat16));
  EXPECT_FALSE(is_half(kFloat32));
  EXPECT_TRUE(is_integer(kInt32) && is_integer(kInt64));
}

// ---- bfloat16 ---------------------------------------------------------------------

TEST(BFloat16, ExactValuesRoundTrip) {
  // 1.0 = 0x3F800000 in fp32 -> top half 0x3F80; -2.0 = 0xC0000000 -> 0xC000.
  EXPECT_EQ(bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(bf16_bits(-2.0f), 0xC000);
  EXPECT_EQ(bf16_bits(0.5f), 0x3F00);
  EXPECT_EQ(bf16_bits(1.0f + two_pow(-7)), 0x3F81);  // one ulp above 1
  for (float v : {1.0f, -2.0f, 0.5f, 3.0f, 1.0f + two_pow(-7), two_pow(-130), 65280.0f})
    EXPECT_EQ(bf16_to_float(float_to_bf16(v)), v);
}

TEST(BFloat16, DecodesToTheTopHalfOfAnFp32) {
  EXPECT_EQ(bf16_to_float({0x4049}), 3.140625f);  // 0x40490000 = 2 * (1 + 73/128)
  EXPECT_EQ(bf16_to_float({0xBF80}), -1.0f);
}

TEST(BFloat16, TiesRoundToEven) {
  // 1 + 2^-8 is 0x3F808000: exactly half an ulp above 0x3F80 (even) -> stays 1.0.
  EXPECT_EQ(std::bit_cast<uint32_t>(1.0f + two_pow(-8)), 0x3F808000u);
  EXPECT_EQ(bf16_bits(1.0f + two_pow(-8)), 0x3F80);
  // 1 + 3*2^-8 is 0x3F818000: half an ulp above 0x3F81 (odd) -> up to 0x3F82.
  EXPECT_EQ(std::bit_cast<uint32_t>(1.0f + 3 * two_pow(-8)), 0x3F818000u);
  EXPECT_EQ(bf16_bits(1.0f + 3 * two_pow(-8)), 0x3F82);
  EXPECT_EQ(bf16_bits(-(1.0f + two_pow(-8))), 0xBF80);
}

TEST(BFloat16, NonTiesRoundToNearest) {
  EXPECT_EQ(bf16_bits(1.0f + two_pow(-8) + two_pow(-20)), 0x3F81);  // just above the tie
  EXPECT_EQ(bf16_bits(1.0f + two_pow(-9)), 0x3F80);                 // below the tie
}

TEST(BFloat16, LargestFloatOverflowsToInfinity) {
  // FLT_MAX = (2 - 2^-23) 2^127 is past the midpoint (2 - 2^-8) 2^127 between
  // bf16's largest finite 0x7F7F and 2^128.
  EXPECT_EQ(bf16_bits(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(bf16_bits(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(bf16_bits(-std::numeric_limits<float>::infinity()), 0xFF80);
}

TEST(BFloat16, NaNStaysNaNEvenWhenItsPayloadIsInTheDroppedBits) {
  // 0x7F800001 is a NaN whose only payload bit would be dropped by truncation (-> inf).
  float snan = std::bit_cast<float>(0x7F800001u);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(snan))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
}

TEST(BFloat16, EveryFinitePatternDecodesAndReEncodesExactly) {
  int mismatches = 0;
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    if ((b & 0x7F80) == 0x7F80 && (b & 0x7F)) continue;  // NaN patterns
    uint16_t h = uint16_t(b);
    int s = h >> 15, e = (h >> 7) & 0xff, m = h & 0x7f;
    double ref = e == 0 ? std::ldexp(double(m), -133)
                        : e == 255 ? std::numeric_limits<double>::infinity() : std::ldexp(1.0 + m / 128.0, e - 127);
    if (s) ref = -ref;
    float f = bf16_to_float({h});
    if (double(f) != ref || float_to_bf16(f).bits != h) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(BFloat16, EveryTieAndASweepOfFloatsMatchAReferenceRounding) {
  int mismatches = 0;
  for (uint32_t top = 0; top < 0x7F80; ++top) {  // every positive finite bf16 and the midpoint above it
    float tie = std::bit_cast<float>((top << 16) | 0x8000u);
    if (double(bf16_to_float(float_to_bf16(tie))) != bf16_round_ref(tie)) ++mismatches;
  }
  for (uint32_t u = 0; u < 0x7F800000u; u += 65521) {  // a prime stride through all finite floats
    for (float f : {std::bit_cast<float>(u), -std::bit_cast<float>(u)})
      if (double(bf16_to_float(float_to_bf16(f))) != bf16_round_ref(f)) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0);
}

// ---- float16 ----------------------------------------------------------------------

TEST(Float16, ExactValuesRoundTrip) {
  EXPECT_EQ(fp16_bits(1.0f), 0x3C00);
  EXPECT_EQ(fp16_bits(-2.0f), 0xC000);
  EXPECT_EQ(fp16_bits(2.5f), 0x4100);      // 1.25 * 2^1: exponent 16, mantissa 256
  EXPECT_EQ(fp16_bits(65504.0f), 0x7BFF);  // largest finite
  EXPECT_EQ(fp16_bits(two_pow(-14)), 0x0400);  // smallest normal
  EXPECT_EQ(fp16_to_float({0x3555}), 0.333251953125f);  // 2^-2 (1 + 341/1024)
  for (float v : {1.0f, -2.0f, 2.5f, 65504.0f, two_pow(-14), two_pow(-24), 1023 * two_pow(-24)})
    EXPECT_EQ(fp16_to_float(float_to_fp16(v)), v);
}

TEST(Float16, TiesRoundToEven) {
  // fp16 keeps 10 fraction bits, so the ulp at 1 is 2^-10.
  EXPECT_EQ(fp16_bits(1.0f + two_pow(-11)), 0x3C00);      // tie, 0x3C00 even
  EXPECT_EQ(fp16_bits(1.0f + 3 * two_pow(-11)), 0x3C02);  // tie, 0x3C01 odd -> up
}

TEST(Float16, OverflowsToInfinityFrom65520) {
  EXPECT_EQ(fp16_bits(65504.0f), 0x7BFF);
  EXPECT_EQ(fp16_bits(65519.0f), 0x7BFF);  // below the midpoint 65520
  EXPECT_EQ(fp16_bits(65520.0f), 0x7C00);  // midpoint to 2^16: ties to even = inf
  EXPECT_EQ(fp16_bits(-65520.0f), 0xFC00);
  EXPECT_EQ(fp16_bits(1e10f), 0x7C00);
  EXPECT_TRUE(std::isinf(fp16_to_float({0x7C00})));
}

TEST(Float16, SubnormalsRoundToNearestEvenMultipleOf2ToThe24) {
  EXPECT_EQ(fp16_bits(two_pow(-24)), 0x0001);                   // smallest subnormal
  EXPECT_EQ(fp16_bits(two_pow(-25)), 0x0000);                   // tie between 0 and 2^-24 -> 0
  EXPECT_EQ(fp16_bits(two_pow(-25) * (1 + two_pow(-10))), 0x0001);  // just above the tie
  EXPECT_EQ(fp16_bits(3 * two_pow(-25)), 0x0002);               // tie between 1 and 2 units -> 2^-23
  EXPECT_EQ(fp16_bits(two_pow(-26)), 0x0000);
  EXPECT_EQ(fp16_bits(-two_pow(-24)), 0x8001);
  EXPECT_EQ(fp16_bits(1023.5f * two_pow(-24)), 0x0400);  // tie 0x3FF/0x400 carries into the exponent
  EXPECT_EQ(fp16_to_float({0x0001}), two_pow(-24));
  EXPECT_TRUE(std::signbit(fp16_to_float({0x8000})));
}

TEST(Float16, NaNStaysNaN) {
  uint16_t h = fp16_bits(std::nanf(""));
  EXPECT_EQ(h & 0x7C00, 0x7C00);
  EXPECT_NE(h & 0x03FF, 0);
  EXPECT_TRUE(std::isnan(fp16_to_float({0x7E00})));
}

TEST(Float16, EveryFinitePatternDecodesToItsClosedFormAndReEncodes) {
  int mismatches = 0;
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    uint16_t h = uint16_t(b);
    if ((h & 0x7C00) == 0x7C00) continue;  // inf / NaN
    float f = fp16_to_float({h});
    if (double(f) != fp16_value_ref(h) || float_to_fp16(f).bits != h) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(Float16, EveryTieAndASweepOfFloatsMatchAReferenceRounding) {
  int mismatches = 0;
  for (uint16_t h = 0; h < 0x7BFF + 1; ++h) {  // midpoint between h and h+1 (12 bits: exact in fp32)
    float mid = float((fp16_value_ref(h) + fp16_value_ref(uint16_t(h + 1))) / 2);
    uint16_t even = (h & 1) ? uint16_t(h + 1) : h;
    if (fp16_bits(mid) != even) ++mismatches;
  }
  for (uint32_t u = 0x32000000u; u < 0x47900000u; u += 4093) {  // 2^-27 .. past 65536
    for (float f : {std::bit_cast<float>(u), -std::bit_cast<float>(u)})
      if (double(fp16_to_float(float_to_fp16(f))) != fp16_round_ref(f)) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0);
}

// ---- creation ---------------------------------------------------------------------

// Out of memory names the tensor, its bytes and what loom already holds, and a
// shape whose bytes overflow 64 bits is refused before any arithmetic wraps.
// (Under ASan the suite sets allocator_may_return_null=1, so the 128 TiB
// request returns null there too.)
TEST(Creation, OutOfMemoryNamesTheShapeDtypeBytesAndLiveBytes) {
  const int64_t n = int64_t(1) << 45;  // 2^45 floats = 128 TiB
  EXPECT_THAT([&] { empty({n}); },
              ThrowsMessage<Error>(AllOf(HasSubstr("out of memory: a tensor of shape [35184372088832] and dtype float32"),
                                         HasSubstr("needs 140737488355328 bytes on cpu"),
                                         HasSubstr("live bytes"))));
  Generator gen(1);
  EXPECT_THAT([&] { randn({n, 2}, gen); }, ThrowsMessage<Error>(HasSubstr("out of memory: a tensor of shape")));
  EXPECT_THAT([&] { empty({n, n}); }, ThrowsMessage<Error>(HasSubstr("more bytes than fit in 64 bits")));
}

TEST(Creation, EmptyHasContiguousStridesAndTheRequestedDtype) {
  Tensor t = empty({2, 3, 4});
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.dtype(), kFloat32);
  EXPECT_TRUE(t.device().is_cpu());
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(empty({5}, kBFloat16).nbytes(), 10u);
}

TEST(Creation, ZerosOnesAndFullFillEveryDtype) {
  EXPECT_THAT(zeros({2, 2}).to_vector<float>(), ElementsAre(0, 0, 0, 0));
  EXPECT_THAT(zeros({3}, kInt64).to_vector<int64_t>(), ElementsAre(0, 0, 0));
  EXPECT_THAT(ones({3}, kInt32).to_vector<int32_t>(), ElementsAre(1, 1, 1));
  EXPECT_EQ(ones({1}, kBFloat16).data<bfloat16>()[0].bits, 0x3F80);
  EXPECT_EQ(full({2}, 2.5, kFloat16).data<float16>()[1].bits, 0x4100);
  EXPECT_THAT(full({2, 2}, -1.5, kFloat64).to_vector<double>(), ElementsAre(-1.5, -1.5, -1.5, -1.5));
  Tensor scalar = full({}, 7.0);
  EXPECT_EQ(scalar.dim(), 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.item<float>(), 7.0f);
}

TEST(Creation, ArangeCountsFromStartInSteps) {
  Tensor ids = arange(5);
  EXPECT_EQ(ids.dtype(), kInt64);
  EXPECT_THAT(ids.to_vector<int64_t>(), ElementsAre(0, 1, 2, 3, 4));
  EXPECT_THAT(arange(0, 1, 0.25).to_vector<float>(), ElementsAre(0, 0.25, 0.5, 0.75));
  // ceil((2 - 1) / 0.5) = 2 elements; the end is excluded.
  EXPECT_THAT(arange(1, 2, 0.5, kFloat64).to_vector<double>(), ElementsAre(1.0, 1.5));
  EXPECT_THAT(arange(3, 0, -1).to_vector<float>(), ElementsAre(3, 2, 1));
  EXPECT_EQ(arange(0).numel(), 0);
}

TEST(Creation, FromVectorCopiesValuesRowMajor) {
  Tensor t = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.data<float>()[1 * 3 + 2], 6.0f);
  EXPECT_EQ(from_vector<int32_t>({4, 5}).shape(), (Shape{2}));  // shape defaults to 1-D
  EXPECT_EQ(from_vector<int64_t>({4, 5}).dtype(), kInt64);
  EXPECT_EQ(from_vector<double>({4, 5}).dtype(), kFloat64);
}

TEST(Creation, TensorConvertsDoublesToTheRequestedDtype) {
  Tensor t = loom::tensor({1, 2, 3, 4}, {2, 2}, kFloat64);
  EXPECT_EQ(t.dtype(), kFloat64);
  EXPECT_THAT(t.to_vector<double>(), ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(loom::tensor({1.0 + std::ldexp(1.0, -8)}, {1}, kBFloat16).data<bfloat16>()[0].bits, 0x3F80);
  EXPECT_EQ(loom::tensor({0.5, 1.5}).dtype(), kFloat32);
}

// ---- random -----------------------------------------------------------------------

TEST(Random, SameSeedGivesIdenticalValues) {
  Generator g1(42), g2(42);
  EXPECT_EQ(randn({1000}, g1).to_vector<float>(), randn({1000}, g2).to_vector<float>());
  EXPECT_EQ(loom::rand({100}, g1).to_vector<float>(), loom::rand({100}, g2).to_vector<float>());
  EXPECT_EQ(randint(0, 10, {100}, g1).to_vector<int64_t>(), randint(0, 10, {100}, g2).to_vector<int64_t>());
}

TEST(Random, DifferentSeedsGiveDifferentValues) {
  Generator g1(1), g2(2);
  std::vector<float> a = randn({1000}, g1).to_vector<float>(), b = randn({1000}, g2).to_vector<float>();
  int equal = 0;
  for (size_t i = 0; i < a.size(); ++i) equal += a[i] == b[i];
  EXPECT_EQ(equal, 0);
}

TEST(Random, ManualSeedRestartsTheStream) {
  Generator g(7);
  std::vector<float> first = randn({10}, g).to_vector<float>();
  g.manual_seed(7);
  EXPECT_EQ(randn({10}, g).to_vector<float>(), first);
}

TEST(Random, SavedStateResumesBitExactly) {
  Generator g(3);
  randn({5}, g);
  auto state = g.state();
  std::vector<float> next = randn({10}, g).to_vector<float>();
  g.set_state(state);
  EXPECT_EQ(randn({10}, g).to_vector<float>(), next);
}

TEST(Random, RandnHasMeanZeroAndStdOne) {
  Generator g(1234);
  std::vector<double> v = randn({100000}, g, kFloat64).to_vector<double>();
  double mean = 0, sq = 0;
  for (double x : v) mean += x;
  mean /= double(v.size());
  for (double x : v) sq += (x - mean) * (x - mean);
  double std = std::sqrt(sq / double(v.size()));
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(std, 1.0, 0.02);
}

TEST(Random, RandnScalesByStdAndShiftsByMean) {
  Generator g(5);
  std::vector<double> v = randn({100000}, g, kFloat64, 3.0, 0.5).to_vector<double>();
  double mean = 0;
  for (double x : v) mean += x;
  EXPECT_NEAR(mean / double(v.size()), 3.0, 0.01);
}

TEST(Random, RandStaysInItsHalfOpenRange) {
  Generator g(9);
  std::vector<double> v = loom::rand({10000}, g, kFloat64, -2.0, 3.0).to_vector<double>();
  double lo = 1e9, hi = -1e9, mean = 0;
  for (double x : v) { lo = std::min(lo, x); hi = std::max(hi, x); mean += x; }
  EXPECT_GE(lo, -2.0);
  EXPECT_LT(hi, 3.0);
  EXPECT_NEAR(mean / double(v.size()), 0.5, 0.05);  // uniform mean (low + high) / 2
}

TEST(Random, RandintCoversEveryValueInLowToHighExclusive) {
  Generator g(11);
  Tensor t = randint(-3, 5, {10000}, g);
  EXPECT_EQ(t.dtype(), kInt64);
  std::set<int64_t> seen;
  for (int64_t v : t.to_vector<int64_t>()) {
    ASSERT_GE(v, -3);
    ASSERT_LT(v, 5);
    seen.insert(v);
  }
  EXPECT_EQ(seen.size(), 8u);
  EXPECT_EQ(randint(0, 4, {3}, g, kInt32).dtype(), kInt32);
}

TEST(Random, LowPrecisionDtypesAreTheDoubleValuesRounded) {
  Generator g1(8), g2(8);
  std::vector<double> d = randn({64}, g1, kFloat64).to_vector<double>();
  Tensor h = randn({64}, g2, kBFloat16);
  for (size_t i = 0; i < d.size(); ++i)
    EXPECT_EQ(h.data<bfloat16>()[i].bits, float_to_bf16(float(d[i])).bits) << i;
}

// ---- dtype conversion -------------------------------------------------------------

TEST(Conversion, ToSameDtypeReturnsTheSameTensor) {
  Tensor x = ones({3});
  EXPECT_TRUE(ops::to(x, kFloat32).is_same(x));
}

TEST(Conversion, FloatToIntTruncatesTowardZero) {
  Tensor x = loom::tensor({2.7, -2.7, 0.5, 3.0});
  EXPECT_THAT(ops::to(x, kInt32).to_vector<int32_t>(), ElementsAre(2, -2, 0, 3));
  EXPECT_THAT(ops::to(x, kInt64).to_vector<int64_t>(), ElementsAre(2, -2, 0, 3));
}

TEST(Conversion, IntToFloatAndBackIsExact) {
  Tensor ids = from_vector<int64_t>({-5, 0, 1 << 20});
  EXPECT_THAT(ops::to(ids, kFloat32).to_vector<float>(), ElementsAre(-5, 0, 1 << 20));
  EXPECT_THAT(ops::to(ops::to(ids, kFloat64), kInt64).to_vector<int64_t>(), ElementsAre(-5, 0, 1 << 20));
}

TEST(Conversion, ToHalfRoundsToNearestEvenAndBackIsExact) {
  float tie = 1.0f + 3 * two_pow(-8);
  Tensor h = ops::to(from_vector<float>({tie, 65520.0f}), kBFloat16);
  EXPECT_EQ(h.data<bfloat16>()[0].bits, 0x3F82);
  EXPECT_THAT(ops::to(h, kFloat32).to_vector<float>(), ElementsAre(1.0f + two_pow(-6), 65536.0f));
  Tensor f16 = ops::to(from_vector<float>({65504.0f, 65520.0f}), kFloat16);
  EXPECT_EQ(f16.data<float16>()[0].bits, 0x7BFF);
  EXPECT_EQ(f16.data<float16>()[1].bits, 0x7C00);
  EXPECT_EQ(ops::to(ops::to(f16, kBFloat16), kFloat64).to_vector<double>()[0], 65536.0);  // 65504 -> bf16
}

TEST(Conversion, NonContiguousSourceConvertsInLogicalOrder) {
  Tensor t = ops::transpose(counting({2, 3}), 0, 1);  // [[0, 3], [1, 4], [2, 5]]
  EXPECT_THAT(ops::to(t, kInt64).to_vector<int64_t>(), ElementsAre(0, 3, 1, 4, 2, 5));
}

// ---- views share storage ----------------------------------------------------------

TEST(Views, ViewSharesStorageSoWritesReachTheBase) {
  Tensor x = counting({6});
  int64_t before = live_bytes();
  Tensor v = ops::view(x, {2, 3});
  EXPECT_EQ(live_bytes(), before);  // no copy
  EXPECT_EQ(v.storage(), x.storage());
  EXPECT_EQ(v.strides(), (Shape{3, 1}));
  v.data<float>()[1 * 3 + 2] = 42;
  EXPECT_EQ(x.to_vector<float>()[5], 42.0f);
  EXPECT_EQ(ops::view(x, {-1, 2}).shape(), (Shape{3, 2}));  // -1 is inferred
}

TEST(Views, ViewOfAZeroDimTensorAddsSizeOneDims) {
  Tensor s = full({}, 3.0);
  Tensor v = ops::view(s, {1, 1});
  EXPECT_EQ(v.shape(), (Shape{1, 1}));
  EXPECT_EQ(v.storage(), s.storage());
  EXPECT_EQ(ops::reshape(s, {1}).storage(), s.storage());
}

TEST(Views, ViewSplitsAContiguousGroupOfANonContiguousTensor) {
  Tensor x = counting({4, 6});
  Tensor left = ops::narrow(x, 1, 0, 3);        // [4, 3], strides [6, 1]
  Tensor v = ops::view(left, {2, 2, 3});        // dim 0 splits; the row stride is kept
  EXPECT_EQ(v.strides(), (Shape{12, 6, 1}));
  EXPECT_EQ(v.storage(), x.storage());
  EXPECT_THAT(v.to_vector<float>(), ElementsAre(0, 1, 2, 6, 7, 8, 12, 13, 14, 18, 19, 20));
}

TEST(Views, ViewOfATransposeThrowsButReshapeCopies) {
  Tensor x = counting({2, 3});
  Tensor t = ops::transpose(x, 0, 1);  // [3, 2], strides [1, 3]
  EXPECT_THAT([&] { ops::view(t, {6}); },
              ThrowsMessage<Error>(AllOf(HasSubstr("view: cannot view [3, 2]"), HasSubstr("strides [1, 3]"),
                                         HasSubstr("as [6]"), HasSubstr("use reshape"))));
  Tensor r = ops::reshape(t, {6});
  EXPECT_NE(r.storage(), x.storage());
  EXPECT_THAT(r.to_vector<float>(), ElementsAre(0, 3, 1, 4, 2, 5));
}

TEST(Views, ReshapeOfAContiguousTensorIsAView) {
  Tensor x = counting({2, 3});
  Tensor r = ops::reshape(x, {3, 2});
  EXPECT_EQ(r.storage(), x.storage());
  x.data<float>()[0] = -1;
  EXPECT_EQ(r.to_vector<float>()[0], -1.0f);
}

TEST(Views, TransposeSwapsShapeAndStrides) {
  Tensor x = counting({2, 3});
  Tensor t = ops::transpose(x, 0, -1);
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_EQ(t.strides(), (Shape{1, 3}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_THAT(t.to_vector<float>(), ElementsAre(0, 3, 1, 4, 2, 5));
  ops::fill_(ops::narrow(t, 0, 2, 1), -1);  // row 2 of t is column 2 of x
  EXPECT_THAT(x.to_vector<float>(), ElementsAre(0, 1, -1, 3, 4, -1));
}

TEST(Views, PermuteReordersDims) {
  Tensor x = counting({2, 3, 4});  // x[i][j][k] = 12i + 4j + k
  Tensor p = ops::permute(x, {2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Shape{1, 12, 4}));
  EXPECT_EQ(p.storage(), x.storage());
  std::vector<float> v = p.to_vector<float>();
  for (int k = 0; k < 4; ++k)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) EXPECT_EQ(v[size_t(k * 6 + i * 3 + j)], float(12 * i + 4 * j + k));
}

TEST(Views, NarrowSelectsARangeWithAnOffset) {
  Tensor x = counting({4, 3});
  Tensor rows = ops::narrow(x, 0, 1, 2);
  EXPECT_EQ(rows.offset(), 3);
  EXPECT_THAT(rows.to_vector<float>(), ElementsAre(3, 4, 5, 6, 7, 8));
  Tensor cols = ops::narrow(x, 1, 1, 2);
  EXPECT_THAT(cols.to_vector<float>(), ElementsAre(1, 2, 4, 5, 7, 8, 10, 11));
  EXPECT_THAT(ops::narrow(x, 0, -1, 1).to_vector<float>(), ElementsAre(9, 10, 11));  // negative start
  ops::fill_(cols, 0);
  EXPECT_THAT(x.to_vector<float>(), ElementsAre(0, 0, 0, 3, 0, 0, 6, 0, 0, 9, 0, 0));
}

TEST(Views, UnsqueezeAndSqueezeAddAndRemoveSizeOneDims) {
  Tensor x = counting({2, 3});
  EXPECT_EQ(ops::unsqueeze(x, 0).shape(), (Shape{1, 2, 3}));
  EXPECT_EQ(ops::unsqueeze(x, 1).shape(), (Shape{2, 1, 3}));
  EXPECT_EQ(ops::unsqueeze(x, -1).shape(), (Shape{2, 3, 1}));
  Tensor u = ops::unsqueeze(ops::unsqueeze(x, 0), 2);  // [1, 2, 1, 3]
  EXPECT_EQ(ops::squeeze(u, 0).shape(), (Shape{2, 1, 3}));
  EXPECT_EQ(ops::squeeze(u, 1).shape(), (Shape{1, 2, 1, 3}));  // size 2: unchanged
  EXPECT_EQ(ops::squeeze(u).shape(), (Shape{2, 3}));
  EXPECT_EQ(ops::squeeze(u).storage(), x.storage());
  EXPECT_THAT(ops::squeeze(u).to_vector<float>(), ElementsAre(0, 1, 2, 3, 4, 5));
}

TEST(Views, ExpandRepeatsWithStrideZeroAndNoCopy) {
  Tensor x = loom::tensor({1, 2, 3}, {3, 1});
  int64_t before = live_bytes();
  Tensor e = ops::expand(x, {2, 3, 4});
  EXPECT_EQ(live_bytes(), before);
  EXPECT_EQ(e.strides(), (Shape{0, 1, 0}));
  EXPECT_FALSE(e.is_contiguous());
  std::vector<float> v = e.to_vector<float>();
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j) EXPECT_EQ(v[size_t(b * 12 + i * 4 + j)], float(i + 1));
  x.data<float>()[1] = 20;  // one write shows up at all 8 expanded positions
  EXPECT_EQ(e.to_vector<float>()[4 + 3], 20.0f);
  EXPECT_EQ(e.to_vector<float>()[12 + 4], 20.0f);
  EXPECT_EQ(ops::expand(x, {-1, 5}).shape(), (Shape{3, 5}));
}

TEST(Views, ContiguousReturnsTheSameTensorWhenAlreadyContiguous) {
  Tensor x = counting({2, 3});
  int64_t before = live_bytes();
  Tensor c = ops::contiguous(x);
  EXPECT_TRUE(c.is_same(x));
  EXPECT_EQ(live_bytes(), before);
}

TEST(Views, ContiguousCopiesANonContiguousTensor) {
  Tensor x = counting({2, 3});
  Tensor t = ops::transpose(x, 0, 1);
  int64_t before = live_bytes();
  Tensor c = ops::contiguous(t);
  EXPECT_EQ(live_bytes() - before, 6 * 4);
  EXPECT_NE(c.storage(), x.storage());
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.strides(), (Shape{2, 1}));
  EXPECT_THAT(c.to_vector<float>(), ElementsAre(0, 3, 1, 4, 2, 5));
  c.data<float>()[0] = 99;  // the copy is independent
  EXPECT_EQ(x.to_vector<float>()[0], 0.0f);
}

TEST(Views, CloneAlwaysCopies) {
  Tensor x = counting({3});
  Tensor c = ops::clone(x);
  EXPECT_NE(c.storage(), x.storage());
  EXPECT_THAT(c.to_vector<float>(), ElementsAre(0, 1, 2));
}

TEST(Views, SplitReturnsViewsWithAShorterLastPiece) {
  Tensor x = counting({5, 2});
  std::vector<Tensor> parts = ops::split(x, 2, 0);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].shape(), (Shape{2, 2}));
  EXPECT_EQ(parts[2].shape(), (Shape{1, 2}));
  EXPECT_THAT(parts[1].to_vector<float>(), ElementsAre(4, 5, 6, 7));
  for (const Tensor& p : parts) EXPECT_EQ(p.storage(), x.storage());
}

// ---- in-place copies --------------------------------------------------------------

TEST(Copy, CopyBroadcastsAndConvertsIntoAView) {
  Tensor dst = zeros({2, 3});
  ops::copy_(dst, from_vector<int64_t>({1, 2, 3}));
  EXPECT_THAT(dst.to_vector<float>(), ElementsAre(1, 2, 3, 1, 2, 3));
  ops::copy_(ops::narrow(dst, 1, 0, 1), loom::tensor({7, 8}, {2, 1}));
  EXPECT_THAT(dst.to_vector<float>(), ElementsAre(7, 2, 3, 8, 2, 3));
}

TEST(Copy, FillAndZeroTouchOnlyTheView) {
  Tensor x = ones({2, 3});
  ops::zero_(ops::narrow(x, 1, 1, 1));
  EXPECT_THAT(x.to_vector<float>(), ElementsAre(1, 0, 1, 1, 0, 1));
  ops::fill_(ops::narrow(x, 0, 0, 1), 2.5);
  EXPECT_THAT(x.to_vector<float>(), ElementsAre(2.5, 2.5, 2.5, 1, 0, 1));
}

// ---- memory counters --------------------------------------------------------------

TEST(MemoryStats, LiveBytesRiseByNumelTimesElementSizeAndFallOnRelease) {
  MemoryStats before = memory_stats();
  {
    Tensor a = empty({10, 7}, kFloat32);
    EXPECT_EQ(memory_stats().live_bytes - before.live_bytes, 10 * 7 * 4);
    EXPECT_EQ(memory_stats().num_allocs - before.num_allocs, 1);
    Tensor b = empty({3, 5}, kBFloat16);
    Tensor c = zeros({4}, kInt64);
    EXPECT_EQ(memory_stats().live_bytes - before.live_bytes, 280 + 30 + 32);
    EXPECT_EQ(memory_stats().num_allocs - before.num_allocs, 3);
  }
  EXPECT_EQ(memory_stats().live_bytes, before.live_bytes);
}

TEST(MemoryStats, AViewKeepsItsStorageAliveAfterTheBaseHandleIsGone) {
  int64_t before = live_bytes();
  Tensor base = empty({100});
  Tensor v = ops::narrow(base, 0, 10, 5);
  base = Tensor();
  EXPECT_EQ(live_bytes() - before, 400);
  v = Tensor();
  EXPECT_EQ(live_bytes(), before);
}

TEST(MemoryStats, PeakTracksTheHighWaterMarkUntilReset) {
  reset_peak_memory_stats();
  int64_t base = live_bytes();
  EXPECT_EQ(memory_stats().peak_bytes, base);
  { Tensor big = empty({1000}); }
  Tensor small = empty({100});
  EXPECT_EQ(memory_stats().peak_bytes, base + 4000);
  EXPECT_EQ(memory_stats().live_bytes, base + 400);
  reset_peak_memory_stats();
  EXPECT_EQ(memory_stats().peak_bytes, base + 400);
}

// ZeRO-3 frees a unit's params between uses and gathers them back into the
// same tensors (parallel/data_parallel/fully_sharded.h).
TEST(MemoryStats, ReleasedStorageFreesItsBytesAndItsViewsSeeTheReallocatedOnes) {
  int64_t before = live_bytes();
  Tensor flat = empty({100});
  Tensor param = ops::view(ops::narrow(flat, 0, 10, 6), {2, 3});  // a param: a view of the flat buffer
  Storage& storage = *flat.storage();
  storage.release();
  EXPECT_FALSE(storage.is_allocated());
  EXPECT_EQ(live_bytes(), before);  // the bytes are gone; the tensors are not
  EXPECT_EQ(param.shape(), Shape({2, 3}));
  const std::string e = test::error_of([&] { param.to_vector<float>(); });
  EXPECT_NE(e.find("was released"), std::string::npos) << e;
  storage.allocate();
  EXPECT_EQ(live_bytes() - before, 400);
  ops::fill_(flat, 0);
  ops::fill_(param, 2);  // writes through the view land in the new bytes
  std::vector<float> v = flat.to_vector<float>();
  EXPECT_EQ(v[9], 0);
  EXPECT_EQ(v[10], 2);
  EXPECT_EQ(v[15], 2);
  EXPECT_EQ(v[16], 0);
  storage.release();
  storage.release();  // a no-op
  EXPECT_EQ(live_bytes(), before);
}

// ---- printing ---------------------------------------------------------------------

TEST(Printing, SmallTensorsPrintNestedValuesAndDtype) {
  EXPECT_EQ(loom::tensor({1, 2, 3, 4}, {2, 2}).str(), "tensor([[1, 2], [3, 4]], float32)");
  EXPECT_EQ(empty({2, 3}, kBFloat16).describe(), "[2, 3] bfloat16");
  EXPECT_EQ(empty({100}).str(), "tensor(shape=[100], float32)");
}

// ---- devices ------------------------------------------------------------------------

TEST(Device, ParsesCpuAndCudaNames) {
  EXPECT_TRUE(Device("cpu").is_cpu());
  EXPECT_EQ(Device("cuda").index, 0);
  EXPECT_EQ(Device("cuda:3").index, 3);
  EXPECT_EQ(Device("cuda:3").str(), "cuda:3");
}

TEST(Device, MalformedNamesThrow) {
  for (const char* bad : {"gpu", "cuda:", "cuda0", "cuda:x", "cuda:1x"})
    EXPECT_THAT([&] { Device d(bad); }, ThrowsMessage<Error>(HasSubstr("device: cannot parse"))) << bad;
}

TEST(Device, AllocatingOnCudaThrowsSayingCuda) {
  // A GPU that does not exist: cuda:0 without CUDA or without a GPU, else past the last one.
  const int n = cuda::device_count();
  const Device missing("cuda:" + std::to_string(n)), further("cuda:" + std::to_string(n + 1));
  int64_t before = live_bytes();
  EXPECT_THAT([&] { empty({2}, kFloat32, missing); },
              ThrowsMessage<Error>(AllOf(HasSubstr("CUDA"), HasSubstr(missing.str()))));
  EXPECT_THAT([&] { zeros({2}, kFloat32, further); }, ThrowsMessage<Error>(HasSubstr("CUDA")));
  EXPECT_EQ(live_bytes(), before);  // nothing was counted
}

// ---- errors ---------------------------------------------------------------------------

TEST(Errors, DataWithTheWrongTypeNamesBothDtypes) {
  Tensor x = zeros({2});
  EXPECT_THAT([&] { x.data<double>(); }, ThrowsMessage<Error>(HasSubstr("data<float64>: tensor has dtype float32")));
  EXPECT_THAT([&] { x.data<bfloat16>(); }, ThrowsMessage<Error>(HasSubstr("tensor has dtype float32")));
}

TEST(Errors, ViewWithTheWrongNumelNamesBothShapes) {
  Tensor x = counting({2, 3});
  EXPECT_THAT([&] { ops::view(x, {4}); },
              ThrowsMessage<Error>(HasSubstr("view: cannot view [2, 3] (6 elements) as [4] (4 elements)")));
  EXPECT_THAT([&] { ops::view(x, {-1, 4}); }, ThrowsMessage<Error>(HasSubstr("cannot view [2, 3]")));
  EXPECT_THAT([&] { ops::reshape(x, {-1, -1}); }, ThrowsMessage<Error>(HasSubstr("only one dimension can be -1")));
}

TEST(Errors, NarrowOutOfRangeNamesTheRangeAndShape) {
  Tensor x = counting({4, 3});
  EXPECT_THAT([&] { ops::narrow(x, 0, 3, 2); },
              ThrowsMessage<Error>(HasSubstr("narrow: [3, 5) out of range for dim 0 of size 4 (shape [4, 3])")));
  EXPECT_THAT([&] { ops::narrow(x, 2, 0, 1); }, ThrowsMessage<Error>(HasSubstr("narrow: dim 2 out of range")));
}

TEST(Errors, BadViewArgumentsAreRejected) {
  Tensor x = counting({2, 3});
  EXPECT_THAT([&] { ops::expand(x, {4, 3, 4}); },
              ThrowsMessage<Error>(HasSubstr("expand: cannot expand [2, 3] to [4, 3, 4]")));
  EXPECT_THAT([&] { ops::permute(x, {0, 0}); }, ThrowsMessage<Error>(HasSubstr("permute: dim 0 repeated")));
  EXPECT_THAT([&] { ops::transpose(x, 0, 2); }, ThrowsMessage<Error>(HasSubstr("transpose: dim 2 out of range")));
}

TEST(Errors, CreationRejectsInconsistentArguments) {
  EXPECT_THAT([] { from_vector<float>({1, 2, 3}, {2, 2}); },
              ThrowsMessage<Error>(HasSubstr("from_vector: 3 values do not fill shape [2, 2] (4 elements)")));
  EXPECT_THAT([] { empty({2, -1}); }, ThrowsMessage<Error>(HasSubstr("empty: negative dimension in shape [2, -1]")));
  EXPECT_THAT([] { arange(0, 1, 0); }, ThrowsMessage<Error>(HasSubstr("arange: step is zero")));
  Generator g;
  EXPECT_THAT([&] { randint(3, 3, {2}, g); }, ThrowsMessage<Error>(HasSubstr("randint: empty range [3, 3)")));
}

TEST(Errors, ItemOfManyElementsNamesTheShape) {
  EXPECT_THAT([] { zeros({2, 2}).item<float>(); },
              ThrowsMessage<Error>(HasSubstr("item: tensor of shape [2, 2] has 4 elements, not 1")));
}
