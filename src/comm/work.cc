#include "zero/work.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/internal/work_state.h"

namespace zero {
namespace internal {

void CommProgress::Start(const OpDesc& op) {
  absl::MutexLock lock(&mu_);
  running_ = op;
  since_ = absl::Now();
}

void CommProgress::Stop() {
  absl::MutexLock lock(&mu_);
  running_.reset();
}

Status CommProgress::CheckStuck(absl::Duration limit) const {
  absl::MutexLock lock(&mu_);
  if (!running_.has_value()) return absl::OkStatus();
  const absl::Duration running_for = absl::Now() - since_;
  if (running_for <= limit) return absl::OkStatus();
  return absl::DeadlineExceededError(
      absl::StrCat(DescribeOp(*running_), " has been running for ", absl::FormatDuration(running_for),
                   ", longer than the communicator's timeout allows (", absl::FormatDuration(limit), ")"));
}

HostWorkState::HostWorkState(OpDesc desc, absl::Duration op_timeout, std::shared_ptr<const CommProgress> progress,
                             Helper helper)
    : WorkState(desc), op_timeout_(op_timeout), progress_(std::move(progress)), helper_(std::move(helper)) {}

void HostWorkState::Complete(Status status) {
  absl::MutexLock lock(&mu_);
  status_ = std::move(status);
  done_ = true;
}

Status HostWorkState::Wait(absl::Duration timeout) {
  const absl::Time start = absl::Now();
  // Run this op (and the ones queued before it) here if the communication thread is not already on them.
  // Only for waits without a deadline: running an op cannot be cut short for a caller's shorter wait.
  if (helper_ != nullptr && timeout == absl::InfiniteDuration()) helper_([this] { return IsCompleted(); });
  // The backstop fires half a timeout after Gloo should have given up on its own.
  const absl::Duration backstop = op_timeout_ + op_timeout_ / 2 + absl::Milliseconds(250);
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; };
  for (;;) {
    const absl::Duration left = timeout - (absl::Now() - start);
    if (mu_.AwaitWithTimeout(absl::Condition(&done), std::min(left, absl::Milliseconds(100)))) return status_;
    if (timeout != absl::InfiniteDuration() && absl::Now() - start >= timeout) {
      return absl::DeadlineExceededError(absl::StrCat("wait for ", Describe(), " timed out after ",
                                                      absl::FormatDuration(timeout),
                                                      " (the op is still pending; its buffers are still in use)"));
    }
    if (progress_ != nullptr && op_timeout_ != absl::InfiniteDuration()) {
      Status stuck = progress_->CheckStuck(backstop);
      if (!stuck.ok()) {
        return absl::DeadlineExceededError(
            absl::StrCat(Describe(), " did not complete: ", stuck.message(), "; the communicator is unusable"));
      }
    }
  }
}

bool HostWorkState::IsCompleted() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

Status HostWorkState::status() const {
  absl::MutexLock lock(&mu_);
  if (!done_) return absl::UnavailableError(absl::StrCat(Describe(), " is pending"));
  return status_;
}

}  // namespace internal

Work::Work() = default;
Work::Work(std::shared_ptr<internal::WorkState> state) : state_(std::move(state)) {}
Work::Work(Work&&) noexcept = default;
Work& Work::operator=(Work&&) noexcept = default;
Work::~Work() = default;

Status Work::Wait(absl::Duration timeout) {
  if (state_ == nullptr) return absl::OkStatus();
  return state_->Wait(timeout);
}

Status Work::WaitStream(CUstream_st* stream) {
  if (state_ == nullptr) return absl::OkStatus();
  return state_->WaitStream(stream);
}

bool Work::IsCompleted() const { return state_ == nullptr || state_->IsCompleted(); }

Status Work::status() const {
  if (state_ == nullptr) return absl::OkStatus();
  return state_->status();
}

int64_t Work::sequence() const { return state_ == nullptr ? -1 : state_->desc().seq; }

std::string Work::Describe() const { return state_ == nullptr ? "empty Work" : state_->Describe(); }

}  // namespace zero
