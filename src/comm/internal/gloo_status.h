// Internal: the one seam where Gloo's exceptions become Status (STYLE point 8).
//
//   try { gloo::allgather(opts); } catch (...) { return GlooExceptionToStatus(std::current_exception(), what); }
//
// Gloo reports transport failures and timeouts as gloo::IoException (timeouts say "Timed out" / "timeout"),
// and broken preconditions as gloo::EnforceNotMet. Mapping: timeout -> kDeadlineExceeded; other I/O errors (a
// peer closed its socket, connection reset) -> kUnavailable; EnforceNotMet and anything else -> kInternal.
#pragma once

#include <chrono>
#include <exception>
#include <string>

#include "absl/time/time.h"
#include "zero/status.h"

namespace zero::internal {

// `what` prefixes the message, e.g. "AllGather#5(f32, 1000 elements) on rank 2 of 4".
Status GlooExceptionToStatus(std::exception_ptr error, const std::string& what);

// Gloo's timeout type; absl::InfiniteDuration() maps to Gloo's kNoTimeout (0 ms).
std::chrono::milliseconds ToGlooTimeout(absl::Duration d);

}  // namespace zero::internal
