// Shared test helpers; see multi_rank.h.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "support/multi_rank.h"
#include "zero/logging.h"
#include "zero/store.h"

namespace zero::testing {

CommOptions TestCommOptions() {
  CommOptions o;
  o.timeout = absl::Seconds(30);
  o.check_order = true;
  o.hostname = "127.0.0.1";
  return o;
}

void RunThreads(int world, const std::function<void(int rank)>& body, absl::Duration test_timeout) {
  absl::Mutex mu;
  std::vector<bool> running(world, true);
  int left = world;
  std::vector<std::thread> threads;
  threads.reserve(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      SetLogRank(r);
      {
        SCOPED_TRACE(absl::StrCat("rank ", r, " of ", world));
        try {
          body(r);
        } catch (const std::exception& e) {
          ADD_FAILURE() << "rank " << r << " of " << world << " threw: " << e.what();
        } catch (...) {
          ADD_FAILURE() << "rank " << r << " of " << world << " threw a non-std exception";
        }
      }
      absl::MutexLock lock(&mu);
      running[r] = false;
      --left;
    });
  }
  {
    absl::MutexLock lock(&mu);
    auto all_done = [&]() { return left == 0; };
    if (!mu.AwaitWithTimeout(absl::Condition(&all_done), test_timeout)) {
      std::vector<int> stuck;
      for (int r = 0; r < world; ++r) {
        if (running[r]) stuck.push_back(r);
      }
      // Threads cannot be cancelled and they reference this frame: fail loudly instead of blocking CI.
      std::fprintf(stderr, "RunRanks/RunThreads(world %d): rank(s) %s still running after %s; aborting the test\n",
                   world, absl::StrJoin(stuck, ", ").c_str(), absl::FormatDuration(test_timeout).c_str());
      std::fflush(stderr);
      std::abort();
    }
  }
  for (auto& t : threads) t.join();
}

Status RunRanksStatus(int world, const std::function<Status(Communicator& comm, int rank)>& body,
                      const RunRanksOptions& options) {
  auto store = Store::Hash();
  absl::Mutex mu;
  Status first;
  auto record = [&](int r, const Status& s) {
    if (s.ok()) return;
    absl::MutexLock lock(&mu);
    if (first.ok()) first = absl::Status(s.code(), absl::StrCat("rank ", r, " of ", world, ": ", s.message()));
  };
  RunThreads(
      world,
      [&](int r) {
        auto comm = Communicator::CreateGloo(store, r, world, options.comm);
        if (!comm.ok()) {
          record(r, comm.status());
          return;
        }
        record(r, body(**comm, r));
      },
      options.test_timeout);
  return first;
}

void RunRanks(int world, const std::function<void(Communicator& comm, int rank)>& body,
              const RunRanksOptions& options) {
  Status s = RunRanksStatus(
      world,
      [&](Communicator& comm, int r) {
        body(comm, r);
        return absl::OkStatus();
      },
      options);
  if (!s.ok()) ADD_FAILURE() << s;
}

}  // namespace zero::testing
