// OrderedExecutor: jobs run one at a time, in push order, on the loop thread or on helping waiters.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/internal/ordered_executor.h"

namespace zero::internal {
namespace {

TEST(OrderedExecutor, RunsInOrderNeverConcurrentlyWithHelpers) {
  OrderedExecutor ex;
  std::thread loop([&] { ex.RunLoop(); });
  constexpr int kJobs = 2000;
  std::atomic<int> in_job{0};
  std::atomic<bool> overlap{false};
  absl::Mutex mu;
  std::vector<int> order;
  std::atomic<int> done{0};
  for (int i = 0; i < kJobs; ++i) {
    ex.Push([&, i] {
      if (in_job.fetch_add(1) != 0) overlap = true;
      {
        absl::MutexLock lock(&mu);
        order.push_back(i);
      }
      in_job.fetch_sub(1);
      done.fetch_add(1);
    });
    // Every few pushes a waiter helps until "its" job ran, racing the loop thread.
    if (i % 7 == 0) ex.Help([&, i] { return done.load() > i; });
  }
  std::vector<std::thread> helpers;
  for (int h = 0; h < 3; ++h) helpers.emplace_back([&] { ex.Help([&] { return done.load() == kJobs; }); });
  for (auto& t : helpers) t.join();
  ex.Stop();
  loop.join();  // returns only once everything ran
  EXPECT_EQ(done.load(), kJobs);
  EXPECT_FALSE(overlap.load());
  ASSERT_EQ(order.size(), static_cast<size_t>(kJobs));
  for (int i = 0; i < kJobs; ++i) ASSERT_EQ(order[i], i);
}

TEST(OrderedExecutor, HelpRunsOnTheCallingThread) {
  OrderedExecutor ex;  // no loop thread at all: only helpers run jobs
  std::thread::id ran_on;
  ex.Push([&] { ran_on = std::this_thread::get_id(); });
  bool finished = false;
  ex.Push([&] { finished = true; });
  ex.Help([&] { return finished; });
  EXPECT_TRUE(finished);
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  const int policy = sched_getscheduler(0);
  ex.Stop();
  ex.RunLoop();  // stopped and drained: returns at once
  EXPECT_EQ(sched_getscheduler(0), policy) << "RunLoop must return under the policy it was entered with";
}

TEST(OrderedExecutor, LoopThreadRunsJobsNobodyWaitsFor) {
  OrderedExecutor ex;
  std::thread loop([&] { ex.RunLoop(); });
  absl::Notification ran;
  ex.Push([&] { ran.Notify(); });
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ex.Stop();
  loop.join();
}

// A waiter that helps keeps the backlog: jobs queued while it runs jobs (a unit's chunks, pushed together) all run
// on its thread, none on the loop thread, even those older than the loop thread's grace period.
TEST(OrderedExecutor, LoopThreadTakesNoJobWhileAWaiterHelps) {
  OrderedExecutor ex;
  std::thread loop([&] { ex.RunLoop(); });
  constexpr int kJobs = 40;
  bool helped = false;
  // The first job must run on the helper; the loop thread may take it if the helper comes after its grace period
  // (a loaded host), so the scenario is retried.
  for (int attempt = 0; attempt < 20 && !helped; ++attempt) {
    std::vector<std::thread::id> ran(kJobs);
    std::atomic<int> done{0};
    ex.Push([&] {
      ran[0] = std::this_thread::get_id();
      // The rest are queued while a job runs, and each is held long past the grace period (100 us).
      for (int i = 1; i < kJobs; ++i) {
        ex.Push([&, i] {
          ran[i] = std::this_thread::get_id();
          usleep(300);
          done.fetch_add(1);
        });
      }
      usleep(300);
      done.fetch_add(1);
    });
    ex.Help([&] { return done.load() == kJobs; });
    while (done.load() < kJobs) usleep(100);  // when the loop thread took the first job
    if (ran[0] != std::this_thread::get_id()) continue;
    helped = true;
    for (int i = 1; i < kJobs; ++i) EXPECT_EQ(ran[i], std::this_thread::get_id()) << "job " << i;
  }
  EXPECT_TRUE(helped) << "the loop thread took the first job in every attempt";
  ex.Stop();
  loop.join();
}

// After a waiter helped, the loop thread leaves the queue to it for the grace period (100 us) even for a job
// pushed long before: the waiter of a unit's chunks is back for the next one within microseconds. (Before, a job
// older than the grace was taken the moment the previous one ended, from under the returning waiter.)
TEST(OrderedExecutor, LoopThreadLeavesTheNextJobToAWaiterThatJustHelped) {
  OrderedExecutor ex;
  std::thread loop([&] { ex.RunLoop(); });
  bool checked = false;
  for (int attempt = 0; attempt < 20 && !checked; ++attempt) {
    std::thread::id a_on, b_on;
    absl::Time a_end, b_start;
    std::atomic<bool> a_done{false}, b_done{false};
    ex.Push([&] {
      a_on = std::this_thread::get_id();
      ex.Push([&] {  // queued while the waiter helps, so no thread takes it before A ends
        b_start = absl::Now();
        b_on = std::this_thread::get_id();
        b_done = true;
      });
      usleep(300);  // B is now older than the grace period
      a_end = absl::Now();
      a_done = true;
    });
    ex.Help([&] { return a_done.load(); });
    while (!b_done.load()) usleep(50);                 // nobody helps again: the loop thread runs B
    if (a_on != std::this_thread::get_id()) continue;  // the loop thread took A (the waiter came late): retry
    checked = true;
    EXPECT_NE(b_on, std::this_thread::get_id());
    EXPECT_GE(b_start - a_end, absl::Microseconds(100)) << "B started within the grace period after the waiter left";
  }
  EXPECT_TRUE(checked) << "the loop thread took the first job in every attempt";
  ex.Stop();
  loop.join();
}

// The loop thread waits under SCHED_BATCH (its wake-ups never preempt a running thread) and runs jobs under
// the normal policy, so an op it runs progresses like one run by the caller.
TEST(OrderedExecutor, LoopThreadWaitsUnderTheBatchPolicyAndRunsJobsUnderTheNormalOne) {
#ifndef SCHED_BATCH
  GTEST_SKIP() << "no SCHED_BATCH on this system";
#else
  bool switchable = false;
  std::thread([&] {
    sched_param param{};
    switchable = sched_getscheduler(0) == SCHED_OTHER && sched_setscheduler(0, SCHED_BATCH, &param) == 0;
  }).join();
  if (!switchable) GTEST_SKIP() << "this sandbox refuses sched_setscheduler(SCHED_BATCH)";
  OrderedExecutor ex;
  std::thread loop([&] { ex.RunLoop(); });
  std::atomic<pid_t> tid{0};
  std::atomic<int> policy_in_job{-1};
  absl::Notification ran;
  ex.Push([&] {  // nobody waits: the loop thread runs it after the grace period
    tid = gettid();
    policy_in_job = sched_getscheduler(0);
    ran.Notify();
  });
  ASSERT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_NE(tid.load(), gettid());
  EXPECT_EQ(policy_in_job.load(), SCHED_OTHER);
  // Idle again, it switches back before it waits.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (sched_getscheduler(tid.load()) != SCHED_BATCH && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(sched_getscheduler(tid.load()), SCHED_BATCH);
  ex.Stop();
  loop.join();
#endif
}

}  // namespace
}  // namespace zero::internal
