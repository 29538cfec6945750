// tests/support/simd_target_guard.h — forces one Highway SIMD target for a test's scope.
#pragma once

#include <cstdint>

#include "core/internal/convert_simd.h"

namespace zero::testing {

// Restores normal dispatch when the scope ends, even on failure.
class SimdTargetGuard {
 public:
  explicit SimdTargetGuard(int64_t bits) { internal::ForceSimdTargetForTest(bits); }
  ~SimdTargetGuard() { internal::ForceSimdTargetForTest(0); }
  SimdTargetGuard(const SimdTargetGuard&) = delete;
  SimdTargetGuard& operator=(const SimdTargetGuard&) = delete;
};

}  // namespace zero::testing
