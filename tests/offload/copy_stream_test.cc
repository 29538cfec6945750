// The copy stream: tasks run in FIFO order on one worker, tickets say when, destruction drains the queue.
#include "offload/copy_stream.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace zero::internal {
namespace {

TEST(CopyStreamTest, RunsTasksInOrderOffTheCallingThread) {
  CopyStream cs;
  std::vector<int> order;
  std::thread::id worker;
  for (int i = 0; i < 100; ++i) {
    cs.Enqueue([&order, &worker, i] {
      order.push_back(i);
      worker = std::this_thread::get_id();
    });
  }
  EXPECT_EQ(cs.last(), 100u);
  cs.Sync();
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  EXPECT_NE(worker, std::this_thread::get_id());
}

TEST(CopyStreamTest, WaitBlocksUntilTheTicketRan) {
  CopyStream cs;
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  const auto first = cs.Enqueue([&] {
    while (!release.load()) std::this_thread::yield();
    ran = 1;
  });
  const auto second = cs.Enqueue([&] { ran = 2; });
  EXPECT_FALSE(cs.Done(first));
  EXPECT_FALSE(cs.Done(second));
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    release = true;
  });
  cs.Wait(first);
  EXPECT_TRUE(cs.Done(first));
  EXPECT_GE(ran.load(), 1);
  cs.Wait(second);
  EXPECT_EQ(ran.load(), 2);
  releaser.join();
  EXPECT_GT(cs.wait_ms(), 0.0);  // the caller really blocked (the worker was held for 20 ms)
  cs.Wait(0);                    // "nothing" returns at once
}

TEST(CopyStreamTest, DestructorRunsEverythingQueued) {
  std::atomic<int> ran{0};
  {
    CopyStream cs;
    for (int i = 0; i < 50; ++i) cs.Enqueue([&] { ran.fetch_add(1); });
  }
  EXPECT_EQ(ran.load(), 50);
}

}  // namespace
}  // namespace zero::internal
