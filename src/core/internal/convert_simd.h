// core/internal/convert_simd.h — the vectorized casts behind zero::ConvertBuffer, and control over which SIMD
// target the host kernels run (tests and benchmarks).
//
// ConvertSimd is Google Highway code compiled for several x86/Arm targets and chosen at run time
// (HWY_DYNAMIC_DISPATCH); every target produces bit for bit what zero/dtype.h's scalar conversions produce.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zero/dtype.h"

namespace zero::internal {

// Converts n elements from src (type st) to dst (type dt), st != dt; f16 <-> bf16 goes through f32 in
// registers (exact, then one rounding, as ConvertBuffer's scalar path). Element alignment suffices; the buffers
// must not overlap.
void ConvertSimd(const void* src, DType st, void* dst, DType dt, size_t n);

// ---- target control (tests and benchmarks) ----
// The host kernels (ConvertSimd, zero::GradStats, the optimizer tiles) are compiled for the same targets, so
// these apply to all of them.
struct SimdTarget {
  int64_t bits;      // Highway's HWY_* bit
  std::string name;  // "AVX3", "AVX2", "SSE4", "SCALAR", ...
};
// Targets compiled into ConvertSimd that this CPU can run, best first.
std::vector<SimdTarget> AvailableSimdTargets();
// Name of the target HWY_DYNAMIC_DISPATCH picks now.
std::string ActiveSimdTarget();
// Restricts dispatch to `bits` (one of AvailableSimdTargets()); 0 restores the normal choice. Process-wide (it
// is Highway's global choice) and not thread-safe: for single-threaded tests and benchmarks only.
void ForceSimdTargetForTest(int64_t bits);

}  // namespace zero::internal
