// tests/support/multi_rank.h — run a test body on N ranks as N threads over real Gloo.
//
//   TEST(AllGather, Works) {
//     zero::testing::RunRanks(4, [](zero::Communicator& comm, int rank) {
//       std::vector<float> mine(8, rank), all(32);
//       ASSERT_OK(comm.AllGather(mine.data(), all.data(), 8, zero::DType::kF32).Wait());  // status_matchers.h
//       EXPECT_EQ(all[8 * 3], 3.0f);
//     });
//   }
//
// Each rank is a thread with its own Gloo communicator (TCP on 127.0.0.1), all rendezvousing through one
// in-process HashStore that is fresh per call. gtest failures inside the body carry "rank r of N" (a
// SCOPED_TRACE per thread). A body that hangs (e.g. a collective some rank never issues) does not block CI:
// after `test_timeout` the process prints which ranks are still running and aborts, which fails the test.
#pragma once

#include <functional>

#include "absl/time/time.h"
#include "zero/communicator.h"
#include "zero/status.h"

namespace zero::testing {

// Options for test communicators: loopback, a 30 s op timeout, order checking on.
CommOptions TestCommOptions();

struct RunRanksOptions {
  CommOptions comm = TestCommOptions();
  // The whole call must finish within this, or the process aborts naming the ranks still running.
  absl::Duration test_timeout = absl::Seconds(120);
};

// Runs `body(comm, rank)` on `world` threads, each with its own communicator. Returns after every rank's body
// returned. A rank whose communicator cannot be created records a gtest failure naming the rank and its
// status; an exception escaping a body is recorded as a failure of that rank.
void RunRanks(int world, const std::function<void(Communicator& comm, int rank)>& body,
              const RunRanksOptions& options = {});

// Like RunRanks, for bodies that return a Status: returns OK if every rank returned OK, else the first
// failure to occur, prefixed with "rank r of N: ". Communicator creation errors are returned the same way.
Status RunRanksStatus(int world, const std::function<Status(Communicator& comm, int rank)>& body,
                      const RunRanksOptions& options = {});

// Runs `body(rank)` on `world` threads without creating communicators (for tests that build their own, e.g.
// rendezvous failures), with the same rank attribution and hang timeout.
void RunThreads(int world, const std::function<void(int rank)>& body, absl::Duration test_timeout = absl::Seconds(120));

}  // namespace zero::testing
