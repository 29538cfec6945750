// Internal: runs jobs one at a time in push order, on a dedicated thread or on a thread that is waiting.
//
// The Gloo communicator queues each op as a job. Its communication thread runs them (RunLoop), so ops
// overlap with the caller's compute. A caller that blocks in Work::Wait may instead run the queued jobs itself
// (Help) while no other thread is running one: the common "issue, then wait" pattern then costs no thread
// hand-off, which on a virtual machine is two wake-ups of tens of microseconds each (measured: ~200 us per
// 1 MiB all-gather at world 4 on an idle 16-core VM). Jobs never run concurrently and always in push order,
// whichever thread runs them.
//
// The loop thread never takes a job while a waiter is helping, nor within the grace period after a waiter last
// helped: a caller that waits on ops in turn (a unit's chunks, shard/internal/collective.h) comes back for the
// next within microseconds, and taking it from under that caller had cost two wake-ups per op (a chunked
// reduce-scatter of 1 MiB chunks at world 4 read 0.87-0.95 of Gloo's calls before this and 0.94-1.03 after, and
// 1.00-1.04 with the loop thread disabled, alternating runs on the 2-core development VM). It still wakes when
// a job is pushed or a helper leaves with jobs queued (to give a waiter its grace period, then to run the job if
// nobody took it). On Linux it waits under SCHED_BATCH, which the scheduler never lets preempt a running
// thread on wake-up, and runs jobs under the normal policy: its wake-ups use idle cores, not the time of
// threads doing work. On a host with more busy threads than cores those wake-ups had preempted the ranks'
// own threads in the middle of their collectives: a reduce-scatter of 1-4 MiB at world 4, four rank threads
// on 2 cores, read 0.85-0.99 of the raw Gloo call with the normal policy and 0.91-1.00 with this, three
// interleaved runs each; an all-gather of 2 MiB timed in separate processes leaned the other way, within that
// method's wider noise (bench/results/comm-gloo-world4.md). The cost: on a host whose cores are all busy, a
// job nobody waits for may start up to a scheduler tick later than the grace period.
#pragma once

#include <sched.h>

#include <algorithm>
#include <deque>
#include <functional>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace zero::internal {

class OrderedExecutor {
 public:
  using Job = std::function<void()>;

  void Push(Job job) {
    absl::MutexLock lock(&mu_);
    queue_.push_back({std::move(job), absl::Now()});
  }

  // The dedicated thread's body: runs jobs until Stop() was called and nothing is queued or running.
  void RunLoop() {
    ThreadPolicy policy;
    for (;;) {
      policy.Waiting();
      Job job;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return !running_ && helpers_ == 0 && (!queue_.empty() || stop_);
        };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;  // stopped and drained
        // A just-pushed op usually belongs to a caller about to Wait on it, and the next queued op to a waiter
        // that has just helped; give either the chance to run it without any hand-off before taking the job.
        // Only such jobs wait: an op nobody waits for starts at most this much later, and a backlog nobody
        // helps with runs back to back.
        auto taken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_ || helpers_ > 0 || queue_.empty(); };
        const absl::Time leave_until = std::max(queue_.front().pushed, helped_) + absl::Microseconds(100);
        if (!stop_ && absl::Now() < leave_until && mu_.AwaitWithDeadline(absl::Condition(&taken), leave_until)) {
          continue;
        }
        job = TakeLocked();
      }
      policy.Running();
      RunAndRelease(job);
    }
  }

  void Stop() {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }

  // Runs queued jobs on the calling thread while no other thread runs one, until `done()` or the queue is
  // empty. Returns at once if another thread is running a job (the caller then blocks on its own op).
  void Help(const std::function<bool()>& done) {
    {
      absl::MutexLock lock(&mu_);
      ++helpers_;
    }
    for (;;) {
      Job job;
      {
        absl::MutexLock lock(&mu_);
        if (running_ || queue_.empty() || done()) {
          --helpers_;
          helped_ = absl::Now();
          return;
        }
        job = TakeLocked();
      }
      RunAndRelease(job);
    }
  }

 private:
  // The calling thread's scheduling policy: SCHED_BATCH while it waits for work, the normal policy while it
  // runs a job (see the top of this file). Switches only on a change; a refused switch (a sandbox without the
  // syscall) leaves the thread under the normal policy, which is only slower. A thread that started under
  // any other policy (real-time, or one its owner chose) is left alone; the thread leaves RunLoop under the
  // policy it entered with.
  class ThreadPolicy {
   public:
    ThreadPolicy() = default;
    ThreadPolicy(const ThreadPolicy&) = delete;
    ThreadPolicy& operator=(const ThreadPolicy&) = delete;
    ~ThreadPolicy() { Running(); }
    void Waiting() { Set(kWaitPolicy); }
    void Running() { Set(SCHED_OTHER); }

   private:
#ifdef SCHED_BATCH
    static constexpr int kWaitPolicy = SCHED_BATCH;
#else
    static constexpr int kWaitPolicy = SCHED_OTHER;
#endif
    void Set(int policy) {
      if (!managed_ || policy == current_) return;
      sched_param param{};
      if (sched_setscheduler(0, policy, &param) == 0) current_ = policy;  // 0: the calling thread (Linux)
    }
    int current_ = sched_getscheduler(0);
    const bool managed_ = current_ == SCHED_OTHER;
  };

  struct Entry {
    Job job;
    absl::Time pushed;
  };

  Job TakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Job job = std::move(queue_.front().job);
    queue_.pop_front();
    running_ = true;
    return job;
  }

  void RunAndRelease(Job& job) {
    job();
    absl::MutexLock lock(&mu_);
    running_ = false;
  }

  absl::Mutex mu_;
  std::deque<Entry> queue_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int helpers_ ABSL_GUARDED_BY(mu_) = 0;                           // threads in Help
  absl::Time helped_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // when a thread last left Help
};

}  // namespace zero::internal
