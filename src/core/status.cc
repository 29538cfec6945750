#include "zero/status.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "core/internal/status_util.h"
#include "zero/logging.h"

namespace zero {

std::string Breadcrumbs(const Status& status) {
  const auto crumbs = status.GetPayload(kBreadcrumbsPayloadUrl);
  return crumbs ? std::string(*crumbs) : std::string();
}

std::string ErrorText(const Status& status) {
  if (status.ok()) return "OK";
  const std::string crumbs = Breadcrumbs(status);
  if (!crumbs.empty()) {
    ZERO_LOG(DEBUG) << "breadcrumbs of \"" << status.message() << "\": " << crumbs;
  }
  return absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message());
}

namespace internal {

namespace {
const char* BaseName(const char* file) {
  const char* slash = std::strrchr(file, '/');
  return slash ? slash + 1 : file;
}
}  // namespace

absl::Status AnnotateStatus(const absl::Status& status, const char* file, int line) {
  if (status.ok()) return status;
  absl::Status out = status;  // the code, the message and every payload as they are
  absl::Cord crumbs = status.GetPayload(kBreadcrumbsPayloadUrl).value_or(absl::Cord());
  if (!crumbs.empty()) crumbs.Append(" ");
  crumbs.Append(absl::StrCat(BaseName(file), ":", line));
  out.SetPayload(kBreadcrumbsPayloadUrl, std::move(crumbs));
  return out;
}

CheckFailure::CheckFailure(const char* file, int line, const std::string& condition) : file_(file), line_(line) {
  stream_ << condition << " ";
}

CheckFailure::~CheckFailure() {
  std::string msg = stream_.str();
  std::fprintf(stderr, "[zero] FATAL %s:%d] %s\n", BaseName(file_), line_, msg.c_str());
  std::fflush(stderr);
  std::abort();
}

Status Reworded(const Status& status, std::string message) {
  if (status.ok()) return status;
  Status out(status.code(), message);
  status.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

}  // namespace internal
}  // namespace zero
