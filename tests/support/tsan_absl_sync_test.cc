// The TSan build's annotations of Debian's uninstrumented Abseil locks (tsan_absl_sync.cc), against TSan itself:
// each scenario runs in a child process (this executable, with --scenario=NAME) whose TSan writes its reports to
// a folder of the test's own, and the test reads them. Data handed between threads through an absl::Mutex,
// Mutex::Await, a CondVar or a Notification gives no report; the same data touched under two different mutexes,
// or handed over through a relaxed atomic (which orders nothing), gives a data race report. So the annotations
// remove exactly the false reports and hide no real race. Built only with ZERO_SANITIZE=thread.
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

extern char** environ;

namespace {

// ---- scenarios (run in the child) ----

// Four threads add to a plain counter under one mutex, and a reader reads it in reader mode.
int GuardedCounter() {
  absl::Mutex mu;
  long counter = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        absl::MutexLock lock(&mu);
        ++counter;
      }
    });
  }
  long seen = 0;
  for (int i = 0; i < 100; ++i) {
    absl::ReaderMutexLock lock(&mu);
    seen = counter;
  }
  for (auto& t : threads) t.join();
  return counter == 4000 && seen <= 4000 ? 0 : 1;
}

// A value handed over by Mutex::Await, then back by CondVar::Wait, then by a Notification: three handoffs.
int Handoffs() {
  absl::Mutex mu;
  absl::CondVar cv;
  bool ready = false, back = false;
  std::vector<int> data;  // not atomic, not guarded by its own lock: only the handoffs order it
  absl::Notification done;
  std::vector<int> result;
  std::thread worker([&] {
    {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(&ready));
    }
    data.push_back(2);
    {
      absl::MutexLock lock(&mu);
      back = true;
      cv.Signal();
    }
    done.WaitForNotification();
    data.push_back(4);
  });
  data.push_back(1);
  {
    absl::MutexLock lock(&mu);
    ready = true;
  }
  {
    absl::MutexLock lock(&mu);
    while (!back) cv.Wait(&mu);
  }
  data.push_back(3);
  done.Notify();
  worker.join();
  return data == std::vector<int>{1, 2, 3, 4} ? 0 : 1;
}

// The writes are ordered in time (the second waits for a relaxed flag the first sets), but nothing orders them
// for the memory model: different mutexes, and a relaxed atomic. TSan must report the race.
int TwoMutexes() {
  absl::Mutex a, b;
  long value = 0;
  std::atomic<bool> first_done{false};
  std::thread first([&] {
    absl::MutexLock lock(&a);
    value = 1;
    first_done.store(true, std::memory_order_relaxed);
  });
  while (!first_done.load(std::memory_order_relaxed)) std::this_thread::yield();
  {
    absl::MutexLock lock(&b);
    value = 2;
  }
  first.join();
  return value == 2 ? 0 : 1;
}

int Scenario(const std::string& name) {
  if (name == "guarded_counter") return GuardedCounter();
  if (name == "handoffs") return Handoffs();
  if (name == "two_mutexes") return TwoMutexes();
  return 2;
}

// ---- the test (runs the scenarios as children) ----

struct ChildResult {
  int exit_code = -1;
  std::string reports;  // every TSan report file the child wrote, concatenated
};

std::string g_self;

ChildResult RunScenario(const std::string& name) {
  std::string dir = (std::filesystem::temp_directory_path() / "zero-tsan-absl-XXXXXX").string();
  EXPECT_NE(::mkdtemp(dir.data()), nullptr);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "TSAN_OPTIONS=", 13) != 0) env.emplace_back(*e);
  }
  // The child's reports go to this test's folder, not to scripts/test.sh's (the race below is wanted).
  env.push_back("TSAN_OPTIONS=log_path=" + dir + "/report:exitcode=66");
  std::vector<char*> envp;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string arg = "--scenario=" + name;
  char* argv[] = {g_self.data(), arg.data(), nullptr};
  pid_t pid = 0;
  ChildResult r;
  EXPECT_EQ(::posix_spawn(&pid, g_self.c_str(), nullptr, nullptr, argv, envp.data()), 0);
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(f.path());
    std::stringstream ss;
    ss << in.rdbuf();
    r.reports += ss.str();
  }
  std::filesystem::remove_all(dir);
  return r;
}

TEST(TsanAbslSync, MutexGuardedCounterGivesNoReport) {
  ChildResult r = RunScenario("guarded_counter");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.reports, "");
}

TEST(TsanAbslSync, AwaitCondVarAndNotificationHandoffsGiveNoReport) {
  ChildResult r = RunScenario("handoffs");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.reports, "");
}

TEST(TsanAbslSync, WritesUnderTwoDifferentMutexesAreStillARace) {
  ChildResult r = RunScenario("two_mutexes");
  EXPECT_EQ(r.exit_code, 66);  // TSan's exit code: the scenario itself succeeded
  EXPECT_NE(r.reports.find("WARNING: ThreadSanitizer: data race"), std::string::npos) << r.reports;
  EXPECT_NE(r.reports.find("TwoMutexes"), std::string::npos) << r.reports;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--scenario=", 11) == 0) return Scenario(argv[i] + 11);
  }
  g_self = std::filesystem::read_symlink("/proc/self/exe").string();
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
