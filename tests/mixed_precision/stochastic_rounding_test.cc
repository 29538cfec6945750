#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "zero/dtype.h"
#include "zero/mixed_precision.h"

namespace zero {
namespace {

// Every result is one of the two bf16 neighbours, the mean over many keys is the input (unbiased), and the
// result depends only on (key, global index), not on how the array is split.
TEST(StochasticRoundingTest, NeighboursUnbiasedAndSplitIndependent) {
  const std::vector<float> xs = {1.0f + 1.0f / 256 / 3, -3.14159f, 1e-30f, 65504.7f, 0.1f};
  for (float x : xs) {
    const uint16_t down = static_cast<uint16_t>(FloatBits(x) >> 16);
    const uint16_t up = static_cast<uint16_t>(down + 1);
    double sum = 0;
    const int kTrials = 20000;
    std::vector<float> src(kTrials, x);
    std::vector<uint16_t> out(kTrials);
    StochasticRoundToBF16(src.data(), out.data(), kTrials, /*key=*/42, /*first_index=*/0);
    for (int i = 0; i < kTrials; ++i) {
      ASSERT_TRUE(out[i] == down || out[i] == up) << x;
      sum += BF16ToF32(out[i]);
    }
    const double ulp = std::abs(BF16ToF32(up) - BF16ToF32(down));
    EXPECT_NEAR(sum / kTrials, x, 0.02 * ulp) << x;  // standard error is about 0.0035 ulp
    // Split into two calls at an odd offset: identical bits.
    std::vector<uint16_t> split(kTrials);
    StochasticRoundToBF16(src.data(), split.data(), 777, 42, 0);
    StochasticRoundToBF16(src.data() + 777, split.data() + 777, kTrials - 777, 42, 777);
    EXPECT_EQ(split, out);
  }
}

TEST(StochasticRoundingTest, ExactValuesAndSpecials) {
  const std::vector<float> src = {1.0f, -2.5f, 0.0f, std::numeric_limits<float>::infinity(),
                                  std::numeric_limits<float>::quiet_NaN()};
  std::vector<uint16_t> out(src.size());
  StochasticRoundToBF16(src.data(), out.data(), src.size(), 7, 0);
  EXPECT_EQ(out[0], F32ToBF16(1.0f));
  EXPECT_EQ(out[1], F32ToBF16(-2.5f));
  EXPECT_EQ(out[2], 0);
  EXPECT_EQ(out[3], 0x7F80);
  EXPECT_TRUE(std::isnan(BF16ToF32(out[4])));
}

}  // namespace
}  // namespace zero
