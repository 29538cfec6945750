// OrderedExecutor: jobs run one at a time, in push order, on the loop thread or on helping waiters.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
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
