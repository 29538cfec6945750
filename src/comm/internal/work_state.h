// Internal: the shared state behind a zero::Work, completed by the backend that runs the op.
//
// A WorkState is shared by the Work the user holds and by the backend (the Gloo communication thread, or the
// NCCL communicator's event bookkeeping). The base class carries what every op has (its OpDesc); the
// subclasses decide how completion is observed: HostWorkState is completed by a thread, NCCL's state polls a
// CUDA event and the communicator's asynchronous error.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "comm/internal/op.h"
#include "zero/status.h"

struct CUstream_st;

namespace zero::internal {

class WorkState {
 public:
  explicit WorkState(OpDesc desc) : desc_(desc) {}
  virtual ~WorkState() = default;
  WorkState(const WorkState&) = delete;
  WorkState& operator=(const WorkState&) = delete;

  // See zero::Work for the contracts.
  virtual Status Wait(absl::Duration timeout) = 0;
  virtual Status WaitStream(CUstream_st* stream) = 0;
  virtual bool IsCompleted() const = 0;
  virtual Status status() const = 0;

  const OpDesc& desc() const { return desc_; }
  std::string Describe() const { return DescribeOp(desc_); }

 private:
  OpDesc desc_;
};

// What a communication thread is doing right now, so that a Wait on any op can tell when the thread has been
// stuck in one op for longer than the communicator's timeout (a backstop: Gloo enforces its own timeouts, and
// this only fires if it ever fails to).
class CommProgress {
 public:
  void Start(const OpDesc& op);
  void Stop();
  // kDeadlineExceeded naming the running op when it has run longer than `limit`; OK otherwise.
  Status CheckStuck(absl::Duration limit) const;

 private:
  mutable absl::Mutex mu_;
  std::optional<OpDesc> running_ ABSL_GUARDED_BY(mu_);
  absl::Time since_ ABSL_GUARDED_BY(mu_);
};

// An op completed by a host thread (Gloo's communication thread) calling Complete().
class HostWorkState final : public WorkState {
 public:
  // Runs queued ops on the waiting thread until `done()` (see OrderedExecutor::Help); may be empty.
  using Helper = std::function<void(const std::function<bool()>& done)>;

  // `op_timeout` is the communicator's per-op timeout; `progress` may be null (then there is no backstop).
  HostWorkState(OpDesc desc, absl::Duration op_timeout, std::shared_ptr<const CommProgress> progress,
                Helper helper = nullptr);

  // Called once by the thread that ran the op.
  void Complete(Status status);

  Status Wait(absl::Duration timeout) override;
  Status WaitStream(CUstream_st* stream) override { return Wait(absl::InfiniteDuration()); }
  bool IsCompleted() const override;
  Status status() const override;

 private:
  const absl::Duration op_timeout_;
  const std::shared_ptr<const CommProgress> progress_;
  const Helper helper_;
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  Status status_ ABSL_GUARDED_BY(mu_);
};

// An op that finished (or failed) before it was queued, e.g. invalid arguments or a broken communicator.
class CompletedWorkState final : public WorkState {
 public:
  CompletedWorkState(OpDesc desc, Status status) : WorkState(desc), status_(std::move(status)) {}
  Status Wait(absl::Duration) override { return status_; }
  Status WaitStream(CUstream_st*) override { return status_; }
  bool IsCompleted() const override { return true; }
  Status status() const override { return status_; }

 private:
  const Status status_;
};

}  // namespace zero::internal
