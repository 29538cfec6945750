// Blockwise int4 (core/internal/quantize.h, qgZ's optional wire format) against its definition, element by
// element: codes round-to-nearest-even(x · 7 / max|x|) packed low nibble first, scales max|x| / 7, the special
// blocks (below the smallest normal: scale 0; a NaN or an infinity: scale NaN, read back as NaN), an odd count, and
// every value read back within half a step of its block.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/internal/quantize.h"

namespace zero::internal {
namespace {

int CodeOf(const std::vector<uint8_t>& q, size_t i) {
  const int nibble = (q[i / 2] >> (i % 2 == 0 ? 0 : 4)) & 0xF;
  return nibble >= 8 ? nibble - 16 : nibble;
}

TEST(QuantizeInt4, MatchesItsDefinitionAndReadsBackWithinHalfAStep) {
  constexpr size_t kN = 1001, kBlock = 64;  // odd: the last byte's high nibble is unused
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(kN);
  for (float& v : x) v = dist(rng);
  for (size_t i = 128; i < 192; ++i) x[i] = 1e-39f;                        // a subnormal block: scale 0
  x[300] = std::numeric_limits<float>::infinity();                         // its block: scale NaN
  for (size_t i = 448; i < 512; ++i) x[i] = -2.5f;                         // constants: exact
  for (size_t i = 576; i < 640; ++i) x[i] = (i & 1) ? 2e-38f : -1.5e-38f;  // normal, 7 / max overflows: scale 0
  std::vector<uint8_t> q(Int4Bytes(kN), 0xFF);
  std::vector<float> scales(QuantBlocks(kN, kBlock)), back(kN);
  QuantizeInt4(x.data(), kN, kBlock, q.data(), scales.data());
  DequantizeInt4(q.data(), scales.data(), kN, kBlock, back.data());
  EXPECT_EQ(q.back() >> 4, 0) << "the unused nibble";
  for (size_t b = 0; b < scales.size(); ++b) {
    const size_t begin = b * kBlock, end = std::min(kN, begin + kBlock);
    float m = 0;
    bool finite = true;
    for (size_t i = begin; i < end; ++i) {
      finite &= std::isfinite(x[i]);
      m = std::max(m, std::fabs(x[i]));
    }
    if (!finite) {
      EXPECT_TRUE(std::isnan(scales[b])) << "block " << b;
      for (size_t i = begin; i < end; ++i) EXPECT_TRUE(std::isnan(back[i])) << "element " << i;
      continue;
    }
    if (!(7.0f / m <= std::numeric_limits<float>::max())) {  // zeros and subnormals too
      EXPECT_EQ(scales[b], 0.0f) << "block " << b;
      for (size_t i = begin; i < end; ++i) EXPECT_EQ(back[i], 0.0f) << "element " << i;
      continue;
    }
    ASSERT_EQ(scales[b], m / 7.0f) << "block " << b;
    for (size_t i = begin; i < end; ++i) {
      const int want = static_cast<int>(std::nearbyint(x[i] * (7.0f / m)));
      ASSERT_EQ(CodeOf(q, i), want) << "element " << i;
      ASSERT_EQ(back[i], static_cast<float>(want) * scales[b]) << "element " << i;
      ASSERT_LE(std::fabs(back[i] - x[i]), 0.5f * m / 7.0f * 1.0001f) << "element " << i;
    }
  }
  for (size_t i = 448; i < 512; ++i) EXPECT_EQ(back[i], -2.5f) << "a constant block reads back exactly";
}

}  // namespace
}  // namespace zero::internal
