// OrderedExecutor: jobs run one at a time, in push order, on the loop thread or on helping waiters.
#include <gtest/gtest.h>

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
  ex.Stop();
  ex.RunLoop();  // stopped and drained: returns at once
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

}  // namespace
}  // namespace zero::internal
