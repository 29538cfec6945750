// DeepSpeed's LR schedules (deepspeed/runtime/lr_schedules.py) at chosen steps, against values worked out by
// hand from its formulas. LrAt(s) is the lr of the (s+1)-th optimizer step = DeepSpeed's get_lr() at
// last_batch_iteration = L0 + s (L0 = -1 for a fresh run), because the engine steps the scheduler after the
// optimizer and the scheduler's constructor already sets get_lr() at -1.

#include <gmock/gmock.h>
#include <cmath>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "support/status_matchers.h"
#include "zero/config.h"
#include "zero/optimizer.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using ::zero::testing::StatusIs;

// Hand-computed values carry their own rounding; 1e-13 relative is far below any formula mistake.
#define EXPECT_LR(actual, expected) EXPECT_NEAR((actual), (expected), 1e-13 * std::abs(expected))

constexpr double kLog10Of2 = 0.30102999566398120;  // log(2) / log(10)
constexpr double kLog10Of3 = 0.47712125471966244;  // log(3) / log(10)

std::unique_ptr<LrScheduler> Make(const SchedulerConfig& c, double base_lr = 1e-3) {
  auto r = MakeLrScheduler(c, base_lr);
  EXPECT_OK(r);
  return r.ok() ? std::move(*r) : nullptr;
}

TEST(LrScheduler, ConstantWhenNoType) {
  auto s = Make(SchedulerConfig{}, 3e-4);
  EXPECT_EQ(s->LrAt(0), 3e-4);
  EXPECT_EQ(s->LrAt(123456), 3e-4);
}

TEST(LrScheduler, WarmupLrLog) {
  SchedulerConfig c;
  c.type = "WarmupLR";
  c.warmup_min_lr = 1e-5;
  c.warmup_max_lr = 1e-3;
  c.warmup_num_steps = 10;  // warmup_type "log" is the default
  auto s = Make(c);
  EXPECT_LR(s->LrAt(0), 1e-5);                        // last_batch_iteration -1: min_lr
  EXPECT_LR(s->LrAt(1), 1e-5);                        // it 0: log(1) = 0
  EXPECT_LR(s->LrAt(2), 1e-5 + 0.00099 * kLog10Of2);  // it 1: log(2)/log(10)
  EXPECT_LR(s->LrAt(3), 1e-5 + 0.00099 * kLog10Of3);  // it 2
  EXPECT_LR(s->LrAt(10), 1e-3);                       // it 9: log(10)/log(10) = 1
  EXPECT_LR(s->LrAt(11), 1e-3);                       // it 10 >= warmup: gamma 1
  EXPECT_LR(s->LrAt(100000), 1e-3);
}

TEST(LrScheduler, WarmupLrLinearAndClampedWarmup) {
  SchedulerConfig c;
  c.type = "WarmupLR";
  c.warmup_min_lr = 1e-5;
  c.warmup_max_lr = 1e-3;
  c.warmup_num_steps = 10;
  c.warmup_type = "linear";
  auto s = Make(c);
  EXPECT_LR(s->LrAt(1), 1e-5);                   // it 0
  EXPECT_LR(s->LrAt(2), 1e-5 + 0.00099 * 0.1);   // it 1: 1/10
  EXPECT_LR(s->LrAt(6), 1e-5 + 0.00099 * 0.5);   // it 5
  EXPECT_LR(s->LrAt(10), 1e-5 + 0.00099 * 0.9);  // it 9
  EXPECT_LR(s->LrAt(11), 1e-3);                  // it 10
  // DeepSpeed uses max(2, warmup_num_steps).
  c.warmup_num_steps = 1;
  c.warmup_min_lr = 0.0;
  s = Make(c);
  EXPECT_LR(s->LrAt(1), 0.0);         // it 0: 0/2
  EXPECT_LR(s->LrAt(2), 0.5 * 1e-3);  // it 1: 1/2
  EXPECT_LR(s->LrAt(3), 1e-3);        // it 2
}

TEST(LrScheduler, WarmupDecayLr) {
  SchedulerConfig c;
  c.type = "WarmupDecayLR";
  c.warmup_min_lr = 1e-5;
  c.warmup_max_lr = 1e-3;
  c.warmup_num_steps = 10;
  c.warmup_type = "linear";
  c.total_num_steps = 100;
  auto s = Make(c);
  EXPECT_LR(s->LrAt(0), 1e-5);
  EXPECT_LR(s->LrAt(4), 1e-5 + 0.00099 * 0.3);            // it 3, warmup
  EXPECT_LR(s->LrAt(11), 1e-3);                           // it 10: (100 - 10) / (100 - 10)
  EXPECT_LR(s->LrAt(56), 1e-5 + 0.00099 * 0.5);           // it 55: 45 / 90
  EXPECT_LR(s->LrAt(92), 1e-5 + 0.00099 * (9.0 / 90.0));  // it 91
  EXPECT_LR(s->LrAt(101), 1e-5);                          // it 100: 0
  EXPECT_LR(s->LrAt(500), 1e-5);                          // max(0, negative)
  // Log warmup is the same as WarmupLR's.
  c.warmup_type = "log";
  s = Make(c);
  EXPECT_LR(s->LrAt(2), 1e-5 + 0.00099 * kLog10Of2);
}

TEST(LrScheduler, WarmupCosineLr) {
  SchedulerConfig c;
  c.type = "WarmupCosineLR";
  c.warmup_num_steps = 10;
  c.warmup_type = "linear";
  c.total_num_steps = 100;
  c.warmup_min_ratio = 0.1;
  c.cos_min_ratio = 0.01;
  auto s = Make(c, 1e-3);
  EXPECT_EQ(s->LrAt(0), 0.0);                       // get_lr() returns 0 before the schedule starts
  EXPECT_LR(s->LrAt(1), 1e-3 * 0.1);                // it 0: ratio 0.1 + 0 * 0.9
  EXPECT_LR(s->LrAt(6), 1e-3 * (0.1 + 0.5 * 0.9));  // it 5
  // it 10: real_last_step 1 of 90: (1 + cos(pi / 90)) / 2 = 0.99969541350954794
  EXPECT_LR(s->LrAt(11), 1e-3 * (0.01 + 0.99 * 0.99969541350954794));
  // it 54: progress 45/90 = 0.5: cosine term 0.5 (cos(pi/2) = 6e-17)
  EXPECT_NEAR(s->LrAt(55), 1e-3 * (0.01 + 0.99 * 0.5), 1e-18);
  EXPECT_LR(s->LrAt(100), 1e-3 * 0.01);   // it 99: progress 1, cos(pi) = -1
  EXPECT_LR(s->LrAt(1000), 1e-3 * 0.01);  // progress clamped to 1 (current DeepSpeed)
  c.warmup_type = "log";
  s = Make(c, 1e-3);
  EXPECT_LR(s->LrAt(3), 1e-3 * (0.1 + kLog10Of3 * 0.9));  // it 2
}

TEST(LrScheduler, LastBatchIterationResumes) {
  SchedulerConfig c;
  c.type = "WarmupDecayLR";
  c.warmup_min_lr = 0.0;
  c.warmup_max_lr = 1e-3;
  c.warmup_num_steps = 10;
  c.warmup_type = "linear";
  c.total_num_steps = 100;
  c.last_batch_iteration = 54;  // resumed after 55 steps
  auto s = Make(c);
  EXPECT_LR(s->LrAt(0), 1e-3 * (46.0 / 90.0));  // it 54
  EXPECT_LR(s->LrAt(1), 1e-3 * 0.5);            // it 55
}

TEST(LrScheduler, InvalidConfigsNameTheKey) {
  auto expect_error = [](const SchedulerConfig& c, const std::string& key) {
    auto r = MakeLrScheduler(c, 1e-3);
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(key))) << key;
  };
  SchedulerConfig c;
  c.type = "OneCycle";
  expect_error(c, "scheduler.type");
  c.type = "WarmupLR";
  c.warmup_num_steps = 0;
  expect_error(c, "scheduler.params.warmup_num_steps");
  c.warmup_num_steps = 10;
  c.warmup_type = "exp";
  expect_error(c, "scheduler.params.warmup_type");
  c.warmup_type = "log";
  c.last_batch_iteration = -2;
  expect_error(c, "scheduler.params.last_batch_iteration");
  c.last_batch_iteration = -1;
  c.type = "WarmupCosineLR";
  c.total_num_steps = 0;
  expect_error(c, "scheduler.params.total_num_steps");
  c.type = "WarmupDecayLR";
  expect_error(c, "scheduler.params.total_num_steps");
}

}  // namespace
}  // namespace zero
