#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "support/status_matchers.h"
#include "zero/mixed_precision.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using ::zero::testing::StatusIs;

struct Expect {
  bool overflow;
  bool skip;
  double scale_after;
  int hysteresis_after;
};

// A scripted sequence checked step by step against DeepSpeed's DynamicLossScaler.update_scale, transcribed by
// hand (window 3, hysteresis 2, initial 16, min 1).
TEST(LossScalerTest, ScriptedTrajectoryMatchesDeepSpeed) {
  LossScaler::Options o;
  o.initial_scale = 16;
  o.min_scale = 1;
  o.window = 3;
  o.hysteresis = 2;
  LossScaler s(o);
  const std::vector<Expect> script = {
      {false, false, 16, 2},  // iter 0: (0 - -1) % 3 = 1
      {false, false, 16, 2},  // iter 1: 2
      {false, false, 32, 2},  // iter 2: 3 % 3 == 0 -> double, refill
      {true, true, 32, 1},    // iter 3: overflow, hysteresis 2 -> 1, scale kept
      {true, true, 16, 1},    // iter 4: overflow, hysteresis used up -> halve
      {false, false, 16, 1},  // iter 5: (5 - 4) % 3 = 1; no refill in non-consecutive mode
      {true, true, 8, 1},     // iter 6: halve
      {false, false, 8, 1},   // iter 7
      {false, false, 8, 1},   // iter 8
      {false, false, 16, 2},  // iter 9: (9 - 6) % 3 == 0 -> double, refill
      {true, true, 16, 1},    // iter 10
      {false, false, 16, 1},  // iter 11
  };
  for (size_t i = 0; i < script.size(); ++i) {
    auto skip = s.Update(script[i].overflow);
    ASSERT_OK(skip) << i;
    EXPECT_EQ(*skip, script[i].skip) << "iter " << i;
    EXPECT_EQ(s.scale(), script[i].scale_after) << "iter " << i;
    EXPECT_EQ(s.hysteresis_left(), script[i].hysteresis_after) << "iter " << i;
  }
}

TEST(LossScalerTest, ConsecutiveHysteresisRefillsOnEveryCleanStep) {
  LossScaler::Options o;
  o.initial_scale = 1024;
  o.window = 1000;
  o.hysteresis = 2;
  o.consecutive_hysteresis = true;
  LossScaler s(o);
  ASSERT_TRUE(*s.Update(true));
  EXPECT_EQ(s.hysteresis_left(), 1);
  EXPECT_EQ(s.scale(), 1024);
  ASSERT_FALSE(*s.Update(false));
  EXPECT_EQ(s.hysteresis_left(), 2);
  ASSERT_TRUE(*s.Update(true));
  ASSERT_TRUE(*s.Update(true));
  EXPECT_EQ(s.scale(), 512);
}

TEST(LossScalerTest, AllOverflowHalvesToMinimumThenFails) {
  LossScaler::Options o;
  o.initial_scale = 8;
  o.min_scale = 2;
  o.hysteresis = 1;
  LossScaler s(o);
  EXPECT_TRUE(*s.Update(true));
  EXPECT_EQ(s.scale(), 4);
  EXPECT_TRUE(*s.Update(true));
  EXPECT_EQ(s.scale(), 2);
  auto r = s.Update(true);
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("min_loss_scale")));
}

TEST(LossScalerTest, NoOverflowDoublesEveryWindow) {
  LossScaler::Options o;
  o.initial_scale = 1;
  o.window = 4;
  LossScaler s(o);
  for (int i = 1; i <= 12; ++i) {
    ASSERT_FALSE(*s.Update(false));
    EXPECT_EQ(s.scale(), 1 << (i / 4)) << i;
  }
}

TEST(LossScalerTest, FromConfig) {
  Fp16Config f;
  EXPECT_EQ(LossScaler::FromConfig(f).scale(), 1.0);  // fp16 disabled
  EXPECT_FALSE(LossScaler::FromConfig(f).dynamic());
  f.enabled = true;
  EXPECT_EQ(LossScaler::FromConfig(f).scale(), 65536.0);  // 2^16
  f.initial_scale_power = 8;
  EXPECT_EQ(LossScaler::FromConfig(f).scale(), 256.0);
  f.loss_scale = 128;  // static
  LossScaler st = LossScaler::FromConfig(f);
  EXPECT_FALSE(st.dynamic());
  EXPECT_TRUE(*st.Update(true));  // skipped, scale unchanged
  EXPECT_EQ(st.scale(), 128.0);
}

}  // namespace
}  // namespace zero
