#include "zero/status.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "support/status_matchers.h"

namespace zero {
namespace {

using ::testing::Eq;
using ::testing::HasSubstr;
using ::testing::Not;
using ::zero::testing::StatusIs;

Status Fails() { return absl::InvalidArgumentError("zero_optimization.stage: 7 is not in 0..3"); }
Status PassesThrough() {
  ZERO_RETURN_IF_ERROR(Fails());
  return absl::OkStatus();
}
constexpr int kInnerLine = __LINE__ - 3;  // PassesThrough's ZERO_RETURN_IF_ERROR
Status PassesThroughTwice() {
  ZERO_RETURN_IF_ERROR(PassesThrough());
  return absl::OkStatus();
}
constexpr int kOuterLine = __LINE__ - 3;
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

TEST(StatusTest, ReturnIfErrorKeepsCodeAndMessage) {
  Status s = PassesThrough();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, Eq("zero_optimization.stage: 7 is not in 0..3")));
}

// The breadcrumbs stay out of the message (what a user reads) and come back, innermost first, from Breadcrumbs.
TEST(StatusTest, BreadcrumbsAreAPayloadNotPartOfTheMessage) {
  const Status s = PassesThroughTwice();
  EXPECT_EQ(std::string(s.message()), "zero_optimization.stage: 7 is not in 0..3");
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("[")));
  EXPECT_EQ(Breadcrumbs(s), absl::StrCat("status_test.cc:", kInnerLine, " status_test.cc:", kOuterLine));
  EXPECT_EQ(Breadcrumbs(Fails()), "");
  EXPECT_EQ(Breadcrumbs(absl::OkStatus()), "");
}

// ErrorText is what programs print: the code's name and the message, no payload (ToString would show them).
TEST(StatusTest, ErrorTextIsCodeAndMessageOnly) {
  const Status s = PassesThroughTwice();
  EXPECT_EQ(ErrorText(s), "INVALID_ARGUMENT: zero_optimization.stage: 7 is not in 0..3");
  EXPECT_THAT(s.ToString(), HasSubstr(kBreadcrumbsPayloadUrl));  // why programs must not print ToString
  EXPECT_EQ(ErrorText(absl::OkStatus()), "OK");
}

// Other payloads ride along untouched.
TEST(StatusTest, PropagationKeepsOtherPayloads) {
  Status s = absl::DataLossError("bad file");
  s.SetPayload("example.com/extra", absl::Cord("x"));
  const Status out = internal::AnnotateStatus(internal::AnnotateStatus(s, "/a/b.cc", 3), "c.cc", 4);
  EXPECT_EQ(out.GetPayload("example.com/extra"), absl::Cord("x"));
  EXPECT_EQ(Breadcrumbs(out), "b.cc:3 c.cc:4");
  EXPECT_EQ(std::string(out.message()), "bad file");
}

TEST(StatusTest, AssignOrReturn) {
  auto ok = AddOne(true);
  ASSERT_OK(ok);
  EXPECT_EQ(*ok, 42);
  auto bad = AddOne(false);
  EXPECT_THAT(bad, StatusIs(absl::StatusCode::kUnavailable, Eq("rank 2 gone")));
  EXPECT_THAT(Breadcrumbs(bad.status()), HasSubstr("status_test.cc:"));
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
