// The engine's copy stream: an ordered queue of copy tasks run by one library-owned worker thread, so copies
// between the compute tier and the host tier overlap the trainer's compute and the host optimizer.
// defines: CopyStream.
//
// It plays the part a CUDA copy stream plays on a GPU — FIFO order, a ticket per task (an event), the caller
// blocks only in Wait/Sync — and on the host engine its tasks are memcpys and the dtype conversions that land a
// reduced gradient in the host tier. On the CUDA engine its tasks issue cudaMemcpyAsync on the engine's own
// non-blocking CUDA copy stream (created in src/shard/cuda_compute.cc's Init; a gradient's copy first waits on an
// event of the compute stream) and synchronize that stream before the task ends.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace zero::internal {

class CopyStream {
 public:
  using Ticket = uint64_t;  // 0 means "nothing": Wait(0) returns at once

  CopyStream() = default;
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;
  ~CopyStream();  // runs what is queued, then joins the worker

  // Queues `task` behind every earlier one (the worker starts on first use). Thread-compatible: one producer.
  Ticket Enqueue(std::function<void()> task);
  // Blocks until the task with `ticket` (and so every earlier one) has run.
  void Wait(Ticket ticket);
  void Sync() { Wait(last_); }
  bool Done(Ticket ticket) const;
  Ticket last() const { return last_; }

  // Milliseconds the worker has spent running tasks, and callers have spent blocked in Wait, since creation.
  double busy_ms() const;
  double wait_ms() const;

 private:
  void Run();

  mutable std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<std::function<void()>> queue_;
  Ticket last_ = 0;  // producer side
  Ticket done_ = 0;  // guarded by mu_
  bool stop_ = false;
  double busy_ms_ = 0, wait_ms_ = 0;
  std::thread worker_;
};

}  // namespace zero::internal
