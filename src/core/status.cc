#include "zero/status.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace zero::internal {

namespace {
const char* BaseName(const char* file) {
  const char* slash = std::strrchr(file, '/');
  return slash ? slash + 1 : file;
}
}  // namespace

absl::Status AnnotateStatus(const absl::Status& status, const char* file, int line) {
  if (status.ok()) return status;
  absl::Status out(status.code(), absl::StrCat(status.message(), " [", BaseName(file), ":", line, "]"));
  status.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
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

}  // namespace zero::internal
