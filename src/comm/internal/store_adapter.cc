#include "comm/internal/store_adapter.h"

#include "absl/time/time.h"
#include "gloo/common/error.h"

namespace zero::internal {
namespace {

absl::Duration FromGloo(std::chrono::milliseconds t) {
  return t.count() == 0 ? absl::InfiniteDuration() : absl::Milliseconds(t.count());
}

}  // namespace

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  Status s = store_->Set(key, std::vector<uint8_t>(data.begin(), data.end()));
  if (!s.ok()) throw gloo::IoException(std::string(s.message()));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  auto v = store_->Get(key, FromGloo(kDefaultTimeout));
  if (!v.ok()) throw gloo::IoException(std::string(v.status().message()));
  return std::vector<char>(v->begin(), v->end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  const absl::Duration total = FromGloo(timeout);
  const absl::Time deadline = total == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + total;
  for (const auto& key : keys) {
    const absl::Duration left = deadline == absl::InfiniteFuture()
                                    ? absl::InfiniteDuration()
                                    : std::max(absl::ZeroDuration(), deadline - absl::Now());
    auto v = store_->Get(key, left);
    // "Wait timeout" keeps Gloo's wording, which GlooExceptionToStatus maps to kDeadlineExceeded.
    if (!v.ok()) throw gloo::IoException("Wait timeout: " + std::string(v.status().message()));
  }
}

}  // namespace zero::internal
