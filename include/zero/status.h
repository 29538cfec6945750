// zero/status.h — the error model: absl::Status at the public boundary, CHECKs for our own invariants.
//
//   absl::Status Load(...) {
//     ZERO_ASSIGN_OR_RETURN(zero::Config cfg, zero::Config::FromJsonFile(path));
//     ZERO_RETURN_IF_ERROR(engine.Finalize(init));      // on error: breadcrumb "engine.cc:42" added
//     ZERO_CHECK_EQ(shard.size(), expected) << "unit " << name;   // aborts: our bug, not the user's
//   }
//
// Public functions return absl::Status / absl::StatusOr<T>, never throw and never exit. Codes are chosen
// deliberately: bad shapes or config values -> kInvalidArgument; calls in the wrong state ->
// kFailedPrecondition; a lost peer -> kUnavailable; a timeout -> kDeadlineExceeded; CUDA/NCCL internals ->
// kInternal. The propagation macros record the caller's file:line so an error that crossed several frames
// carries breadcrumbs (NCCL's `NCCLCHECK` does the same with its `-> code` lines). They go in a payload
// (kBreadcrumbsPayloadUrl), not in the message: `status.message()` stays the sentence a user acts on, and a
// program prints ErrorText(status), which logs the breadcrumbs at debug level (ZERO_LOG_LEVEL=debug) for
// whoever debugs zero. Note that absl::Status::ToString() prints payloads, breadcrumbs included.
#pragma once

#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zero {

using Status = absl::Status;
template <typename T>
using StatusOr = absl::StatusOr<T>;
using absl::OkStatus;

// The payload type URL under which the propagation macros keep breadcrumbs.
inline constexpr char kBreadcrumbsPayloadUrl[] = "zero.dev/breadcrumbs";

// The file:line of every ZERO_RETURN_IF_ERROR / ZERO_ASSIGN_OR_RETURN `status` passed through, innermost
// (nearest the error) first, separated by spaces: "store.cc:210 comm.cc:88". Empty if it passed none.
std::string Breadcrumbs(const Status& status);

// The line a program prints for an error: "CODE: message", e.g. "UNAVAILABLE: rank 2 gone" ("OK" for an ok
// status), without payloads or breadcrumbs. Because it is where an error leaves the program, it also logs
// the breadcrumbs at debug level, so `ZERO_LOG_LEVEL=debug` shows where the error travelled.
std::string ErrorText(const Status& status);

namespace internal {

// Returns `status` with "file:line" (the file's base name only) added to its breadcrumbs payload.
absl::Status AnnotateStatus(const absl::Status& status, const char* file, int line);

// Collects a CHECK failure message; the destructor prints it with file:line and aborts.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const std::string& condition);
  CheckFailure(const CheckFailure&) = delete;
  CheckFailure& operator=(const CheckFailure&) = delete;
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return stream_; }

 private:
  const char* file_;
  int line_;
  std::ostringstream stream_;
};

template <typename T>
void PrintCheckValue(std::ostream& os, const T& v) {
  if constexpr (requires { os << v; }) {
    os << v;
  } else {
    os << "<unprintable>";
  }
}

// Returns nullopt when `ok`, else "expr (a vs b)" so a failed comparison shows both sides (gloo's ENFORCE_EQ).
template <typename A, typename B>
std::optional<std::string> CheckOpMessage(bool ok, const A& a, const B& b, const char* expr) {
  if (ABSL_PREDICT_TRUE(ok)) return std::nullopt;
  std::ostringstream os;
  os << expr << " (";
  PrintCheckValue(os, a);
  os << " vs ";
  PrintCheckValue(os, b);
  os << ")";
  return os.str();
}

}  // namespace internal
}  // namespace zero

#define ZERO_INTERNAL_CONCAT_IMPL(a, b) a##b
#define ZERO_INTERNAL_CONCAT(a, b) ZERO_INTERNAL_CONCAT_IMPL(a, b)

// Evaluates `expr` (an absl::Status); on error returns it from the enclosing function with file:line added to
// its breadcrumbs.
#define ZERO_RETURN_IF_ERROR(expr)                                               \
  do {                                                                           \
    ::absl::Status _zero_status = (expr);                                        \
    if (ABSL_PREDICT_FALSE(!_zero_status.ok()))                                  \
      return ::zero::internal::AnnotateStatus(_zero_status, __FILE__, __LINE__); \
  } while (0)

// Evaluates `expr` (an absl::StatusOr<T>); on error returns its status (annotated), else moves the value
// into `lhs`, which may be a declaration: ZERO_ASSIGN_OR_RETURN(auto x, Make());
#define ZERO_ASSIGN_OR_RETURN(lhs, expr) \
  ZERO_INTERNAL_ASSIGN_OR_RETURN(ZERO_INTERNAL_CONCAT(_zero_statusor_, __LINE__), lhs, expr)
#define ZERO_INTERNAL_ASSIGN_OR_RETURN(tmp, lhs, expr)                                                          \
  auto tmp = (expr);                                                                                            \
  if (ABSL_PREDICT_FALSE(!tmp.ok())) return ::zero::internal::AnnotateStatus(tmp.status(), __FILE__, __LINE__); \
  lhs = std::move(tmp).value()

// Invariant checks for bugs in zero itself (user input gets a Status). They abort with file:line and the
// streamed message: ZERO_CHECK(ptr != nullptr) << "unit " << name;
#define ZERO_CHECK(cond)              \
  while (ABSL_PREDICT_FALSE(!(cond))) \
  ::zero::internal::CheckFailure(__FILE__, __LINE__, "Check failed: " #cond).stream()

#define ZERO_INTERNAL_CHECK_OP(op, a, b)                                                                 \
  while (auto _zero_check_msg = ::zero::internal::CheckOpMessage((a)op(b), (a), (b), #a " " #op " " #b)) \
  ::zero::internal::CheckFailure(__FILE__, __LINE__, "Check failed: " + *_zero_check_msg).stream()

#define ZERO_CHECK_EQ(a, b) ZERO_INTERNAL_CHECK_OP(==, a, b)
#define ZERO_CHECK_NE(a, b) ZERO_INTERNAL_CHECK_OP(!=, a, b)
#define ZERO_CHECK_LT(a, b) ZERO_INTERNAL_CHECK_OP(<, a, b)
#define ZERO_CHECK_LE(a, b) ZERO_INTERNAL_CHECK_OP(<=, a, b)
#define ZERO_CHECK_GT(a, b) ZERO_INTERNAL_CHECK_OP(>, a, b)
#define ZERO_CHECK_GE(a, b) ZERO_INTERNAL_CHECK_OP(>=, a, b)

// Checks `status.ok()` for calls that cannot fail unless zero has a bug.
#define ZERO_CHECK_OK(expr)                                               \
  do {                                                                    \
    ::absl::Status _zero_check_status = (expr);                           \
    ZERO_CHECK(_zero_check_status.ok()) << _zero_check_status.ToString(); \
  } while (0)
