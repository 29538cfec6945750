// zero/work.h — the handle of one asynchronous communication op.
//
//   zero::Work w = comm.AllGather(shard, full, n, zero::DType::kBF16);
//   ...compute that does not touch `shard` or `full`...
//   ZERO_RETURN_IF_ERROR(w.Wait());                 // host-blocking join; buffers reusable after this
//   // or, on the CUDA path: w.WaitStream(compute_stream);   // stream-ordered join, returns at once
//
// A Work is move-only and [[nodiscard]]: dropping one without joining it is almost always a bug (the buffers
// are still in use by the op). Destroying an unjoined Work does not cancel the op; the op still completes in
// issue order. A default-constructed Work is already complete and OK.
//
// Join a Work from the thread that holds it (it moves between threads with its owner). A failed op's status names
// the op and its sequence number; the errors are listed at Wait.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "zero/status.h"

struct CUstream_st;

namespace zero {

namespace internal {
class WorkState;  // shared between the Work and the backend that completes it
}

class [[nodiscard]] Work {
 public:
  Work();
  explicit Work(std::shared_ptr<internal::WorkState> state);
  Work(Work&&) noexcept;
  Work& operator=(Work&&) noexcept;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  ~Work();

  // Blocks the calling thread until the op finished or `timeout` passed. Returns the op's status: OK,
  // kUnavailable (a peer was lost), kDeadlineExceeded (the op or this wait timed out; the message names the
  // op and its sequence number), kInternal (backend error). absl::InfiniteDuration() waits for the
  // communicator's own op timeout (comm_timeout_s) to decide. On the CUDA path, returns once the op's
  // device work completed.
  [[nodiscard]] Status Wait(absl::Duration timeout = absl::InfiniteDuration());

  // CUDA path: makes `stream` wait for the op's end event (cudaStreamWaitEvent) and returns at once; errors
  // surface later through Wait or the communicator. Host path: same as Wait() (host buffers have no stream).
  [[nodiscard]] Status WaitStream(CUstream_st* stream);

  // True once the op finished, successfully or not. Never blocks.
  bool IsCompleted() const;
  // The op's status if completed, else kUnavailable("pending").
  Status status() const;
  // The communicator-wide sequence number of the op (0-based, in issue order), or -1 for an empty Work.
  int64_t sequence() const;
  // e.g. "AllGather#12(bf16, 4096 elements)".
  std::string Describe() const;

 private:
  std::shared_ptr<internal::WorkState> state_;
};

}  // namespace zero
