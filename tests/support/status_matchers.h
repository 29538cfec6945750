// tests/support/status_matchers.h — gmock matchers and macros for absl::Status and absl::StatusOr<T>.
//
//   EXPECT_OK(engine->Step());
//   ASSERT_OK_AND_ASSIGN(auto model, GptModel::Create(cfg, 1));
//   EXPECT_THAT(model->Param("h.7", "qkv_w"), StatusIs(absl::StatusCode::kNotFound));
//   EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("rank 2")));
//
// The names mirror absl_testing's (absl/status/status_matchers.h), which Debian 12's abseil (20220623) lacks, so
// tests can switch to it by changing the include. One difference: StatusIs(code, "text") here matches when the
// message CONTAINS "text" (absl_testing compares for equality). Call sites spell ::testing::HasSubstr explicitly
// so they read the same under both. Every failure prints the actual status, also for a StatusOr (which this
// abseil cannot print itself).
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zero::testing {
namespace status_internal {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

// gtest prints an absl::Status as the actual value, but this abseil's StatusOr only as bytes: name its status.
template <typename StatusType>
void ExplainStatus(const StatusType& actual, ::testing::MatchResultListener* listener) {
  if constexpr (!std::is_same_v<StatusType, absl::Status>) *listener << "whose status is " << GetStatus(actual);
}

// IsOk(): the status (or the StatusOr's status) is OK.
class IsOkMatcher {
 public:
  template <typename StatusType>
  bool MatchAndExplain(const StatusType& actual, ::testing::MatchResultListener* listener) const {
    ExplainStatus(actual, listener);
    return GetStatus(actual).ok();
  }
  void DescribeTo(std::ostream* os) const { *os << "is OK"; }
  void DescribeNegationTo(std::ostream* os) const { *os << "is not OK"; }
};

// StatusIs(code[, message_matcher]): the code is `code` and the message matches (any message without a matcher).
class StatusIsMatcher {
 public:
  explicit StatusIsMatcher(absl::StatusCode code,
                           std::optional<::testing::Matcher<const std::string&>> message = std::nullopt)
      : code_(code), message_(std::move(message)) {}

  template <typename StatusType>
  bool MatchAndExplain(const StatusType& actual, ::testing::MatchResultListener* listener) const {
    ExplainStatus(actual, listener);
    const absl::Status& status = GetStatus(actual);
    if (status.code() != code_) return false;
    return !message_.has_value() || message_->Matches(std::string(status.message()));
  }
  void DescribeTo(std::ostream* os) const {
    *os << "has status code " << absl::StatusCodeToString(code_);
    if (message_.has_value()) {
      *os << " and a message that ";
      message_->DescribeTo(os);
    }
  }
  void DescribeNegationTo(std::ostream* os) const {
    *os << "does not have status code " << absl::StatusCodeToString(code_);
    if (message_.has_value()) {
      *os << " or has a message that ";
      message_->DescribeNegationTo(os);
    }
  }

 private:
  absl::StatusCode code_;
  std::optional<::testing::Matcher<const std::string&>> message_;
};

}  // namespace status_internal

// Matches an OK absl::Status or absl::StatusOr<T>.
inline ::testing::PolymorphicMatcher<status_internal::IsOkMatcher> IsOk() {
  return ::testing::MakePolymorphicMatcher(status_internal::IsOkMatcher());
}

// Matches a status (or a StatusOr's status) with this code and any message.
inline ::testing::PolymorphicMatcher<status_internal::StatusIsMatcher> StatusIs(absl::StatusCode code) {
  return ::testing::MakePolymorphicMatcher(status_internal::StatusIsMatcher(code));
}

// ... with this code and a message containing `substring` (see the header comment: a substring, not equality).
inline ::testing::PolymorphicMatcher<status_internal::StatusIsMatcher> StatusIs(absl::StatusCode code,
                                                                                absl::string_view substring) {
  return ::testing::MakePolymorphicMatcher(
      status_internal::StatusIsMatcher(code, ::testing::HasSubstr(std::string(substring))));
}

// ... with this code and a message (a std::string) that `message_matcher` matches, e.g. ::testing::HasSubstr.
template <typename MessageMatcher,
          std::enable_if_t<!std::is_convertible_v<const MessageMatcher&, absl::string_view>, int> = 0>
::testing::PolymorphicMatcher<status_internal::StatusIsMatcher> StatusIs(absl::StatusCode code,
                                                                         MessageMatcher message_matcher) {
  return ::testing::MakePolymorphicMatcher(status_internal::StatusIsMatcher(
      code, ::testing::SafeMatcherCast<const std::string&>(std::move(message_matcher))));
}

}  // namespace zero::testing

// EXPECT_OK(expr) / ASSERT_OK(expr): expr (an absl::Status or absl::StatusOr<T>) is OK; the failure prints it.
// Both take a streamed message: ASSERT_OK(s) << "rank " << rank.
#define EXPECT_OK(expr) EXPECT_THAT((expr), ::zero::testing::IsOk())
#define ASSERT_OK(expr) ASSERT_THAT((expr), ::zero::testing::IsOk())

// ASSERT_OK_AND_ASSIGN(auto x, StatusOrExpr): asserts the StatusOr is OK (printing its status if not), then moves
// its value into `lhs` (a declaration or an existing lvalue).
#define ZERO_TEST_CONCAT_IMPL(a, b) a##b
#define ZERO_TEST_CONCAT(a, b) ZERO_TEST_CONCAT_IMPL(a, b)
#define ASSERT_OK_AND_ASSIGN(lhs, rexpr) \
  ZERO_TEST_ASSERT_OK_AND_ASSIGN_IMPL(ZERO_TEST_CONCAT(_zero_test_status_or_, __LINE__), lhs, rexpr)
#define ZERO_TEST_ASSERT_OK_AND_ASSIGN_IMPL(tmp, lhs, rexpr)         \
  auto tmp = (rexpr);                                                \
  ASSERT_OK(tmp) << "in ASSERT_OK_AND_ASSIGN(" #lhs ", " #rexpr ")"; \
  lhs = std::move(tmp).value()
