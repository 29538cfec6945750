#include "zero/status.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/status_matchers.h"

namespace zero {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::zero::testing::StatusIs;

Status Fails() { return absl::InvalidArgumentError("zero_optimization.stage: 7 is not in 0..3"); }
Status PassesThrough() {
  ZERO_RETURN_IF_ERROR(Fails());
  return absl::OkStatus();
}
StatusOr<int> Value(bool ok) {
  if (!ok) return absl::UnavailableError("rank 2 gone");
  return 41;
}
StatusOr<int> AddOne(bool ok) {
  ZERO_ASSIGN_OR_RETURN(int v, Value(ok));
  return v + 1;
}
Status AssignExisting(bool ok, int* out) {
  int v = 0;
  ZERO_ASSIGN_OR_RETURN(v, Value(ok));
  *out = v;
  return absl::OkStatus();
}

TEST(StatusTest, ReturnIfErrorKeepsCodeAndAddsBreadcrumb) {
  Status s = PassesThrough();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          AllOf(HasSubstr("zero_optimization.stage"), HasSubstr("status_test.cc:"))));
}

TEST(StatusTest, AssignOrReturn) {
  auto ok = AddOne(true);
  ASSERT_OK(ok);
  EXPECT_EQ(*ok, 42);
  auto bad = AddOne(false);
  EXPECT_THAT(bad, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("rank 2 gone [status_test.cc:")));
  int out = 0;
  EXPECT_OK(AssignExisting(true, &out));
  EXPECT_EQ(out, 41);
  EXPECT_FALSE(AssignExisting(false, &out).ok());
}

TEST(StatusTest, OkPassesUntouched) { EXPECT_OK(internal::AnnotateStatus(absl::OkStatus(), "x.cc", 1)); }

TEST(StatusDeathTest, CheckPrintsBothSides) {
  int a = 3, b = 4;
  EXPECT_DEATH(ZERO_CHECK_EQ(a, b) << "unit h.0", "a == b \\(3 vs 4\\).*unit h.0");
  EXPECT_DEATH(ZERO_CHECK(a > b) << "why", "Check failed: a > b.*why");
  ZERO_CHECK_LT(a, b) << "never printed";
  ZERO_CHECK(a < b);
}

}  // namespace
}  // namespace zero
