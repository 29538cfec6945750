#include "zero/dtype.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "support/status_matchers.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using ::zero::testing::StatusIs;

bool IsNaN16(uint16_t h, DType t) {
  return t == DType::kF16 ? ((h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0) : ((h & 0x7F80) == 0x7F80 && (h & 0x7F) != 0);
}
float To32(uint16_t h, DType t) { return t == DType::kF16 ? F16ToF32(h) : BF16ToF32(h); }
uint16_t To16(float f, DType t) { return t == DType::kF16 ? F32ToF16(f) : F32ToBF16(f); }

class Dtype16Test : public ::testing::TestWithParam<DType> {};

// Every 16-bit pattern widens exactly and narrows back to itself (NaN stays NaN, with its sign).
TEST_P(Dtype16Test, AllPatternsRoundTrip) {
  const DType t = GetParam();
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = To32(h, t);
    if (IsNaN16(h, t)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << i;
      const uint16_t back = To16(f, t);
      ASSERT_TRUE(IsNaN16(back, t)) << std::hex << i;
      ASSERT_EQ(back & 0x8000, h & 0x8000) << std::hex << i;
      continue;
    }
    ASSERT_EQ(To16(f, t), h) << std::hex << i << " -> " << f;
  }
}

// Widening matches the closed form: (-1)^s * 2^(e-bias) * (1.m) or subnormal; checked in double.
TEST_P(Dtype16Test, AllPatternsWidenToClosedForm) {
  const DType t = GetParam();
  const int mant_bits = t == DType::kF16 ? 10 : 7;
  const int exp_bits = t == DType::kF16 ? 5 : 8;
  const int bias = (1 << (exp_bits - 1)) - 1;
  for (uint32_t i = 0; i < 65536; ++i) {
    const int sign = (i >> 15) & 1;
    const int e = (i >> mant_bits) & ((1 << exp_bits) - 1);
    const int m = i & ((1 << mant_bits) - 1);
    if (e == (1 << exp_bits) - 1) continue;  // inf/NaN covered above and below
    double mag = e == 0 ? std::ldexp(m, 1 - bias - mant_bits) : std::ldexp((1 << mant_bits) + m, e - bias - mant_bits);
    double expect = sign ? -mag : mag;
    ASSERT_EQ(static_cast<double>(To32(static_cast<uint16_t>(i), t)), expect) << std::hex << i;
  }
}

// Narrowing rounds to nearest, ties to even: for every pair of adjacent finite 16-bit values, the exact
// midpoint goes to the even one, and values just inside the midpoint go to the nearer one.
TEST_P(Dtype16Test, AllMidpointsRoundToNearestEven) {
  const DType t = GetParam();
  const uint16_t max_finite = t == DType::kF16 ? 0x7BFF : 0x7F7F;
  for (uint32_t i = 0; i < max_finite; ++i) {
    for (uint16_t sign : {uint16_t{0}, uint16_t{0x8000}}) {
      const uint16_t lo = static_cast<uint16_t>(i | sign), hi = static_cast<uint16_t>((i + 1) | sign);
      const double a = To32(lo, t), b = To32(hi, t);
      const double mid = (a + b) / 2;  // exact in double; representable in float for both types
      const float midf = static_cast<float>(mid);
      ASSERT_EQ(static_cast<double>(midf), mid);
      const uint16_t even = (lo & 1) == 0 ? lo : hi;
      ASSERT_EQ(To16(midf, t), even) << std::hex << lo << " " << hi;
      ASSERT_EQ(To16(std::nextafter(midf, static_cast<float>(a)), t), lo) << std::hex << lo;
      ASSERT_EQ(To16(std::nextafter(midf, static_cast<float>(b)), t), hi) << std::hex << hi;
    }
  }
}

TEST_P(Dtype16Test, OverflowAndSpecials) {
  const DType t = GetParam();
  const uint16_t inf = t == DType::kF16 ? 0x7C00 : 0x7F80;
  EXPECT_EQ(To16(std::numeric_limits<float>::infinity(), t), inf);
  EXPECT_EQ(To16(-std::numeric_limits<float>::infinity(), t), inf | 0x8000);
  EXPECT_EQ(To16(std::numeric_limits<float>::max(), t), inf);
  EXPECT_EQ(To16(-std::numeric_limits<float>::max(), t), inf | 0x8000);
  EXPECT_TRUE(IsNaN16(To16(std::numeric_limits<float>::quiet_NaN(), t), t));
  EXPECT_TRUE(IsNaN16(To16(-std::numeric_limits<float>::quiet_NaN(), t), t));
  // A signalling NaN whose payload lives only in the low bits must not collapse to inf.
  EXPECT_TRUE(IsNaN16(To16(BitsToFloat(0x7F800001u), t), t));
  EXPECT_EQ(To16(0.0f, t), 0);
  EXPECT_EQ(To16(-0.0f, t), 0x8000);
  if (t == DType::kF16) {
    EXPECT_EQ(F32ToF16(65504.0f), 0x7BFF);
    EXPECT_EQ(F32ToF16(65519.99f), 0x7BFF);
    EXPECT_EQ(F32ToF16(65520.0f), 0x7C00);
    EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
    EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);  // half of it: tie to even (zero)
    EXPECT_EQ(F32ToF16(std::ldexp(1.5f, -25)), 0x0001);
    EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  } else {
    EXPECT_EQ(F32ToBF16(1.0f), 0x3F80);
    EXPECT_EQ(F32ToBF16(BitsToFloat(0x3F808000u)), 0x3F80);  // tie, even stays
    EXPECT_EQ(F32ToBF16(BitsToFloat(0x3F818000u)), 0x3F82);  // tie, odd rounds up
    EXPECT_EQ(F32ToBF16(BitsToFloat(0x00000001u)), 0x0000);  // f32 subnormals below bf16's ulp
  }
}

// ConvertBuffer agrees with the scalar conversions for every type pair on random and edge inputs.
TEST_P(Dtype16Test, ConvertBufferMatchesScalar) {
  const DType t = GetParam();
  std::mt19937 rng(7);
  std::vector<float> src(4099);
  std::uniform_int_distribution<uint32_t> bits;
  for (auto& v : src) v = BitsToFloat(bits(rng));
  src[0] = std::numeric_limits<float>::infinity();
  src[1] = std::numeric_limits<float>::quiet_NaN();
  src[2] = 1e-40f;
  std::vector<uint16_t> narrow(src.size());
  ConvertBuffer(src.data(), DType::kF32, narrow.data(), t, src.size());
  std::vector<float> wide(src.size());
  ConvertBuffer(narrow.data(), t, wide.data(), DType::kF32, src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(narrow[i], To16(src[i], t)) << i;
    if (IsNaN16(narrow[i], t)) {
      ASSERT_TRUE(std::isnan(wide[i]));
    } else {
      ASSERT_EQ(FloatBits(wide[i]), FloatBits(To32(narrow[i], t))) << i;
    }
  }
  // 16-bit to the other 16-bit type goes through f32.
  const DType other = t == DType::kF16 ? DType::kBF16 : DType::kF16;
  std::vector<uint16_t> cross(src.size());
  ConvertBuffer(narrow.data(), t, cross.data(), other, src.size());
  for (size_t i = 0; i < src.size(); ++i) ASSERT_EQ(cross[i], To16(To32(narrow[i], t), other)) << i;
}

INSTANTIATE_TEST_SUITE_P(Types, Dtype16Test, ::testing::Values(DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(DtypeTest, NamesAndSizes) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(*ParseDType("bfloat16"), DType::kBF16);
  EXPECT_EQ(*ParseDType("fp16"), DType::kF16);
  EXPECT_EQ(*ParseDType("FP32"), DType::kF32);
  auto bad = ParseDType("int8");
  EXPECT_THAT(bad, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("int8")));
}

}  // namespace
}  // namespace zero
