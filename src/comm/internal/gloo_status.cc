#include "comm/internal/gloo_status.h"

#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"

namespace zero::internal {
namespace {

bool LooksLikeTimeout(const std::string& message) {
  const std::string lower = absl::AsciiStrToLower(message);
  return absl::StrContains(lower, "timed out") || absl::StrContains(lower, "timeout");
}

}  // namespace

Status GlooExceptionToStatus(std::exception_ptr error, const std::string& what) {
  try {
    std::rethrow_exception(error);
  } catch (const gloo::IoException& e) {
    const std::string message = e.what();
    if (LooksLikeTimeout(message)) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, " timed out (a peer died, hung, or issued a different op): gloo: ", message));
    }
    return absl::UnavailableError(absl::StrCat(what, " failed: a peer was lost: gloo: ", message));
  } catch (const gloo::EnforceNotMet& e) {
    return absl::InternalError(absl::StrCat(what, " failed: gloo precondition: ", e.what()));
  } catch (const std::exception& e) {
    const std::string message = e.what();
    if (LooksLikeTimeout(message)) {
      return absl::DeadlineExceededError(absl::StrCat(what, " timed out: gloo: ", message));
    }
    return absl::InternalError(absl::StrCat(what, " failed: ", message));
  } catch (...) {
    return absl::InternalError(absl::StrCat(what, " failed with an unknown exception"));
  }
}

std::chrono::milliseconds ToGlooTimeout(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return std::chrono::milliseconds(0);
  const int64_t ms = absl::ToInt64Milliseconds(d);
  return std::chrono::milliseconds(ms < 1 ? 1 : ms);
}

}  // namespace zero::internal
