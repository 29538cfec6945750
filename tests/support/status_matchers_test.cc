// The status matchers themselves: they match what they should, fail on what they should not (a matcher that
// always passes would silently weaken every test that uses it), and their failures print the actual status.
#include "support/status_matchers.h"

#include <gmock/gmock.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zero::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

absl::StatusOr<int> Seven() { return 7; }
absl::StatusOr<int> Missing() { return absl::NotFoundError("no such unit: h.7"); }

TEST(StatusMatchersTest, IsOkOnStatusAndStatusOr) {
  EXPECT_THAT(absl::OkStatus(), IsOk());
  EXPECT_THAT(Seven(), IsOk());
  EXPECT_THAT(absl::InternalError("x"), Not(IsOk()));
  EXPECT_THAT(Missing(), Not(IsOk()));
  EXPECT_OK(absl::OkStatus());
  EXPECT_OK(Seven());
  ASSERT_OK(absl::OkStatus());
  ASSERT_OK(Seven()) << "streams a message like ASSERT_TRUE";
}

TEST(StatusMatchersTest, StatusIsComparesTheCode) {
  EXPECT_THAT(absl::NotFoundError("x"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(Missing(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(absl::OkStatus(), StatusIs(absl::StatusCode::kOk));
  EXPECT_THAT(Seven(), StatusIs(absl::StatusCode::kOk));
  EXPECT_THAT(Missing(), Not(StatusIs(absl::StatusCode::kInvalidArgument)));
  EXPECT_THAT(absl::OkStatus(), Not(StatusIs(absl::StatusCode::kNotFound)));
}

TEST(StatusMatchersTest, StatusIsComparesTheMessage) {
  // A plain string is a substring.
  EXPECT_THAT(Missing(), StatusIs(absl::StatusCode::kNotFound, "h.7"));
  EXPECT_THAT(Missing(), StatusIs(absl::StatusCode::kNotFound, std::string("no such unit")));
  EXPECT_THAT(Missing(), Not(StatusIs(absl::StatusCode::kNotFound, "h.8")));
  // The code must match too, whatever the message.
  EXPECT_THAT(Missing(), Not(StatusIs(absl::StatusCode::kInternal, "h.7")));
  // Any string matcher.
  EXPECT_THAT(Missing(), StatusIs(absl::StatusCode::kNotFound, AllOf(HasSubstr("unit"), HasSubstr("h.7"))));
  EXPECT_THAT(Missing(), StatusIs(absl::StatusCode::kNotFound, ::testing::Eq("no such unit: h.7")));
  EXPECT_THAT(Missing(), Not(StatusIs(absl::StatusCode::kNotFound, ::testing::Eq("no such unit"))));
  EXPECT_THAT(absl::InvalidArgumentError("rank 2: [4,5]"),
              Not(StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr("rank 2"), HasSubstr("[4,4]")))));
}

TEST(StatusMatchersTest, FailuresPrintTheActualStatus) {
  EXPECT_NONFATAL_FAILURE(EXPECT_OK(absl::DataLossError("bf16.nonfinite_grads")), "bf16.nonfinite_grads");
  EXPECT_NONFATAL_FAILURE(EXPECT_OK(Missing()), "NOT_FOUND: no such unit: h.7");
  EXPECT_NONFATAL_FAILURE(EXPECT_THAT(Missing(), StatusIs(absl::StatusCode::kInvalidArgument)),
                          "NOT_FOUND: no such unit: h.7");
  EXPECT_NONFATAL_FAILURE(EXPECT_THAT(Missing(), StatusIs(absl::StatusCode::kNotFound, "h.8")), "h.7");
  // The expectation names what was wanted.
  EXPECT_NONFATAL_FAILURE(EXPECT_THAT(Missing(), StatusIs(absl::StatusCode::kInvalidArgument, "h.7")),
                          "has status code INVALID_ARGUMENT");
}

// The ASSERT_ forms return from the test function on failure.
void AssertOkOnError() {
  ASSERT_OK(absl::UnavailableError("rank 2 gone"));
  ADD_FAILURE() << "not reached";
}
void AssertOkAndAssignOnError(int* out) {
  ASSERT_OK_AND_ASSIGN(*out, Missing());
  ADD_FAILURE() << "not reached";
}

TEST(StatusMatchersTest, AssertFormsAreFatal) {
  EXPECT_FATAL_FAILURE(AssertOkOnError(), "UNAVAILABLE: rank 2 gone");
  static int out = -1;  // EXPECT_FATAL_FAILURE's statement may only refer to static locals
  EXPECT_FATAL_FAILURE(AssertOkAndAssignOnError(&out), "no such unit: h.7");
  EXPECT_EQ(out, -1);
}

TEST(StatusMatchersTest, AssertOkAndAssignMovesTheValue) {
  ASSERT_OK_AND_ASSIGN(int seven, Seven());
  EXPECT_EQ(seven, 7);
  ASSERT_OK_AND_ASSIGN(auto owned, absl::StatusOr<std::unique_ptr<int>>(std::make_unique<int>(3)));
  ASSERT_NE(owned, nullptr);
  EXPECT_EQ(*owned, 3);
  std::string existing;
  ASSERT_OK_AND_ASSIGN(existing, absl::StatusOr<std::string>("assigned"));
  EXPECT_EQ(existing, "assigned");
}

}  // namespace
}  // namespace zero::testing
