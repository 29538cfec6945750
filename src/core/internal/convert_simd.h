// core/internal/convert_simd.h — the vectorized casts behind zero::ConvertBuffer, a streaming copy, and control
// over which SIMD target the host kernels run (ZERO_SIMD_TARGET, tests and benchmarks).
//
// ConvertSimd is Google Highway code compiled for several x86/Arm targets and chosen at run time
// (HWY_DYNAMIC_DISPATCH); every target produces bit for bit what zero/dtype.h's scalar conversions produce.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "zero/dtype.h"

namespace zero::internal {

// Converts n elements from src (type st) to dst (type dt), st != dt; f16 <-> bf16 goes through f32 in
// registers (exact, then one rounding, as ConvertBuffer's scalar path). Element alignment suffices; the buffers
// must not overlap.
void ConvertSimd(const void* src, DType st, void* dst, DType dt, size_t n);

// Copies `bytes` bytes from src to dst (not overlapping) with non-temporal stores: for a large copy whose
// destination nobody reads soon (an asynchronous checkpoint's staging, read next by the disk), it skips the read
// each ordinary store makes of the line it writes, and does not evict the trainer's working set. Any alignment;
// the bytes are visible to every thread when it returns (a store fence). Bit for bit std::memcpy.
void CopyStreaming(void* dst, const void* src, size_t bytes);

// ---- target control ----
// The host kernels (ConvertSimd, zero::GradStats, the optimizer tiles) are compiled for the same targets and
// share Highway's one process-wide choice, so all of this applies to all of them.
//
// ZERO_SIMD_TARGET=<name> (AVX3, AVX2, SSE4, EMU128: Highway's names, any case) restricts every host kernel of
// the process to that one target; each process reads it itself, so the ranks zero-run starts obey it too. It is
// applied before the first dispatch: every dispatch site (and every function below) calls
// ApplySimdTargetFromEnv first. A name that is not a target of this build on this CPU is an error from
// Engine::Create (SimdTargetEnvStatus); a kernel dispatched without one stops the process there,
// with a message that names the value and lists the targets offered, instead of running another target: a test
// run that asked for SSE4 and ran AVX3 would report on the wrong kernels. The target that runs is logged at
// debug level (ZERO_LOG_LEVEL=debug). docs/internals/design.md, "SIMD targets and tolerances".
struct SimdTarget {
  int64_t bits;      // Highway's HWY_* bit
  std::string name;  // "AVX3", "AVX2", "SSE4", "EMU128", ...
};
// Reads ZERO_SIMD_TARGET and restricts dispatch to it (hwy::DisableTargets), once per process; later calls
// return at once. Thread-safe. On a bad value, prints the error of SimdTargetFromName and aborts.
void ApplySimdTargetFromEnv();
// ZERO_SIMD_TARGET's value checked, without aborting: kInvalidArgument naming the value and the targets offered
// here when it names none of them (Engine::Create returns it, so a trainer's typo is an error, not an abort).
absl::Status SimdTargetEnvStatus();
// Targets compiled into the kernels that this CPU can run, best first, whatever ZERO_SIMD_TARGET says.
std::vector<SimdTarget> CpuSimdTargets();
// The target `name` (a ZERO_SIMD_TARGET value, a benchmark's --simd) names, case-insensitively, among `offered`;
// InvalidArgument naming the value and listing `offered` when it is not one of them (an unknown name, or a
// target this CPU or build lacks).
absl::StatusOr<SimdTarget> SimdTargetFromName(absl::string_view name, const std::vector<SimdTarget>& offered);
// The targets dispatch may use now, best first: CpuSimdTargets(), or only ZERO_SIMD_TARGET's when it is set.
std::vector<SimdTarget> AvailableSimdTargets();
// Name of the target HWY_DYNAMIC_DISPATCH picks now.
std::string ActiveSimdTarget();
// Restricts dispatch to `bits` (one of AvailableSimdTargets()); 0 restores the normal choice (ZERO_SIMD_TARGET's
// when set). Process-wide (it is Highway's global choice) and not thread-safe: for single-threaded tests and
// benchmarks only.
void ForceSimdTargetForTest(int64_t bits);

}  // namespace zero::internal
