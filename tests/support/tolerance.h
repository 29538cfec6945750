// tests/support/tolerance.h — the worst deviation a tolerance test measured, printed beside its bound.
//
// Tests that compare runs which add in different orders (world sizes, hybrid against full sharding, ZeRO against
// a trainer's own optimizer, bf16 against fp32) carry the ctest label `tolerance`. Their bounds come from the
// worst deviation measured under every SIMD target (ZERO_SIMD_TARGET) and several OpenBLAS kernels
// (OPENBLAS_CORETYPE), with a margin: bench/results/cpu-targets.md. Each compared quantity prints its worst as
//   [tolerance] HybridProcessesTest.MatchesFullShardingAndTheThreadRun grad_norm: worst 3.3e-04 bound 3e-03
// which scripts/test-targets.sh collects over targets and kernels.
//
//   testing::Deviation loss("loss", 1e-5);
//   for (...) EXPECT_TRUE(loss.Add(std::abs(a - b) / std::abs(b))) << "step " << k;
#pragma once

#include <cstdio>
#include <string>
#include <utility>

#include "gtest/gtest.h"

namespace zero::testing {

class Deviation {
 public:
  Deviation(std::string what, double bound) : what_(std::move(what)), bound_(bound) {}
  // Prints the worst recorded, when the test ends its scope (also after a failed ASSERT).
  ~Deviation() {
    const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
    std::printf("[tolerance] %s.%s %s: worst %.2g bound %.2g\n", t != nullptr ? t->test_suite_name() : "?",
                t != nullptr ? t->name() : "?", what_.c_str(), worst_, bound_);
    std::fflush(stdout);
  }
  Deviation(const Deviation&) = delete;
  Deviation& operator=(const Deviation&) = delete;

  // Records one deviation (>= 0) and says whether it is within the bound. NaN counts as the worst and fails.
  bool Add(double d) {
    if (!(d <= worst_)) worst_ = d;
    return d <= bound_;
  }
  double worst() const { return worst_; }
  double bound() const { return bound_; }

 private:
  std::string what_;
  double bound_;
  double worst_ = 0;
};

}  // namespace zero::testing
