// tests/support/engine_helpers.h — small helpers for engine-level tests.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "zero/communicator.h"
#include "zero/status.h"

// ASSERT_OK_AND_ASSIGN(auto x, StatusOrExpr): fails the test with the status if it is not OK.
#define ZERO_TEST_CONCAT_IMPL(a, b) a##b
#define ZERO_TEST_CONCAT(a, b) ZERO_TEST_CONCAT_IMPL(a, b)
#define ASSERT_OK_AND_ASSIGN(lhs, expr) ASSERT_OK_AND_ASSIGN_IMPL(ZERO_TEST_CONCAT(_zero_test_sor_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  ASSERT_TRUE(tmp.ok()) << tmp.status();          \
  lhs = std::move(tmp).value()

namespace zero::testing {

// A non-owning shared_ptr to a communicator the test fixture owns (the Engine shares its communicator).
inline std::shared_ptr<Communicator> Borrow(Communicator& c) {
  return std::shared_ptr<Communicator>(&c, [](Communicator*) {});
}

}  // namespace zero::testing
