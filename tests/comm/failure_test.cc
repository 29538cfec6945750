// Work semantics and failures on thread-ranks: desync detection, timeouts of ranks that hang or never
// arrive, invalid arguments, and a broken communicator failing later ops at once. Timeouts are 1 s.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "zero/communicator.h"

namespace zero {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::zero::testing::StatusIs;

using testing::RunRanks;
using testing::RunRanksOptions;
using testing::RunThreads;

RunRanksOptions ShortTimeout(bool check_order) {
  RunRanksOptions o;
  o.comm.timeout = absl::Seconds(1);
  o.comm.check_order = check_order;
  return o;
}

TEST(Work, DefaultIsCompleteAndOk) {
  Work w;
  EXPECT_TRUE(w.IsCompleted());
  EXPECT_OK(w.Wait());
  EXPECT_OK(w.status());
  EXPECT_EQ(w.sequence(), -1);
}

TEST(Work, MovedFromWorkIsEmpty) {
  RunRanks(1, [](Communicator& comm, int) {
    Work a = comm.Barrier();
    Work b = std::move(a);
    EXPECT_OK(b.Wait());
    EXPECT_EQ(b.sequence(), 0);
    EXPECT_EQ(b.Describe(), "Barrier#0");
  });
}

// Check mode: the first op on which ranks disagree fails on every rank with a message naming both ops.
TEST(Desync, CheckModeNamesBothOps) {
  RunRanks(
      2,
      [](Communicator& comm, int rank) {
        std::vector<float> a(1000), b(2000), c(250);
        ASSERT_OK(comm.Barrier().Wait());  // Barrier#0 agrees
        Status s = rank == 0 ? comm.AllGather(a.data(), b.data(), 1000, DType::kF32).Wait()
                             : comm.ReduceScatter(a.data(), c.data(), 250, DType::kF32, ReduceOp::kSum).Wait();
        EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition,
                                HasSubstr("rank 0 issued AllGather#1(f32, 1000 elements) but rank 1 issued "
                                          "ReduceScatter#1(f32, 250 elements, sum)")));
        // The communicator is broken: later ops fail at once with the cause.
        Status later = comm.Barrier().Wait();
        EXPECT_THAT(later, StatusIs(absl::StatusCode::kFailedPrecondition,
                                    AllOf(HasSubstr("Barrier#2"), HasSubstr("failed earlier"))));
      },
      ShortTimeout(/*check_order=*/true));
}

TEST(Desync, CountMismatchIsCaught) {
  RunRanks(
      3,
      [](Communicator& comm, int rank) {
        std::vector<float> buf(100);
        Status s = comm.AllReduce(buf.data(), rank == 2 ? 99 : 100, DType::kF32, ReduceOp::kSum).Wait();
        EXPECT_THAT(std::string(s.message()), HasSubstr("rank 0 issued AllReduce#0(f32, 100 elements, sum) but rank 2 "
                                                        "issued AllReduce#0(f32, 99 elements, sum)"))
            << s;
      },
      ShortTimeout(true));
}

// The two reduce-scatter variants run different Gloo instances, so mixing them across ranks is a desync.
TEST(Desync, MixedReduceScatterVariantsAreCaught) {
  RunRanks(
      2,
      [](Communicator& comm, int rank) {
        std::vector<float> in(200), out(100);
        Status s = rank == 0
                       ? comm.ReduceScatter(in.data(), out.data(), 100, DType::kF32, ReduceOp::kSum).Wait()
                       : comm.ReduceScatterDestructive(in.data(), out.data(), 100, DType::kF32, ReduceOp::kSum).Wait();
        EXPECT_THAT(std::string(s.message()),
                    HasSubstr("but rank 1 issued ReduceScatterDestructive#0(f32, 100 elements, sum)"))
            << s;
      },
      ShortTimeout(true));
}

// Without check mode a desync is not diagnosed, but it still cannot hang: the op times out naming itself.
TEST(Desync, WithoutCheckModeTimesOut) {
  RunRanks(
      2,
      [](Communicator& comm, int rank) {
        std::vector<float> a(64), b(128);
        const absl::Time start = absl::Now();
        Status s = rank == 0 ? comm.AllGather(a.data(), b.data(), 64, DType::kF32).Wait()
                             : comm.AllReduce(a.data(), 64, DType::kF32, ReduceOp::kSum).Wait();
        const auto names_op = HasSubstr(rank == 0 ? "AllGather#0" : "AllReduce#0");
        EXPECT_THAT(s, AnyOf(StatusIs(absl::StatusCode::kDeadlineExceeded, names_op),
                             StatusIs(absl::StatusCode::kUnavailable, names_op)));
        EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "hang guard";
      },
      ShortTimeout(false));
}

// A rank that is alive but never issues the op: the others fail with kDeadlineExceeded naming op and sequence.
TEST(Timeout, RankThatHangs) {
  absl::Notification others_done;
  std::atomic<int> finished{0};
  RunRanks(
      3,
      [&](Communicator& comm, int rank) {
        if (rank == 2) {
          others_done.WaitForNotification();
          return;
        }
        std::vector<float> v(1000, 1.0f);
        const absl::Time start = absl::Now();
        Status s = comm.AllReduce(v.data(), v.size(), DType::kF32, ReduceOp::kSum).Wait();
        EXPECT_THAT(s, StatusIs(absl::StatusCode::kDeadlineExceeded,
                                HasSubstr("AllReduce#0(f32, 1000 elements, sum) on rank")));
        EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "hang guard";
        if (++finished == 2) others_done.Notify();
      },
      ShortTimeout(false));
}

// A rank that never arrives at the rendezvous: the others' CreateGloo fails within the timeout.
TEST(Timeout, RankThatNeverArrives) {
  auto store = Store::Hash();
  CommOptions options = testing::TestCommOptions();
  options.timeout = absl::Seconds(1);
  RunThreads(2, [&](int rank) {
    const absl::Time start = absl::Now();
    auto comm = Communicator::CreateGloo(store, rank, /*world_size=*/3, options);
    EXPECT_THAT(comm, StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("never arrived")));
    EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "hang guard";
  });
}

TEST(Work, WaitWithShortTimeoutLeavesOpPending) {
  absl::Notification go;
  RunRanks(2, [&](Communicator& comm, int rank) {
    std::vector<float> v(10, 1.0f);
    if (rank == 1) {
      go.WaitForNotification();
    }
    Work w = comm.AllReduce(v.data(), v.size(), DType::kF32, ReduceOp::kSum);
    if (rank == 0) {
      Status early = w.Wait(absl::Milliseconds(20));
      EXPECT_THAT(early, StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("still pending")));
      EXPECT_FALSE(w.IsCompleted());
      EXPECT_THAT(w.status(), StatusIs(absl::StatusCode::kUnavailable));
      go.Notify();
    }
    EXPECT_OK(w.Wait());
    EXPECT_EQ(v[0], 2.0f);
  });
}

TEST(Args, InvalidArgumentsFailTheOpAndBreakTheCommunicator) {
  RunRanks(1, [](Communicator& comm, int) {
    std::vector<float> v(4);
    Status bad_root = comm.Broadcast(v.data(), 4, DType::kF32, /*root=*/3).Wait();
    EXPECT_THAT(bad_root,
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("Broadcast#0(f32, 4 elements, root 3)")));
    Status later = comm.Barrier().Wait();
    EXPECT_THAT(later, StatusIs(absl::StatusCode::kInvalidArgument));
  });
  RunRanks(1, [](Communicator& comm, int) {
    Status null_buf = comm.AllReduce(nullptr, 4, DType::kF32, ReduceOp::kSum).Wait();
    EXPECT_THAT(null_buf, StatusIs(absl::StatusCode::kInvalidArgument));
    // Zero elements with a null pointer is fine.
  });
  RunRanks(1,
           [](Communicator& comm, int) { EXPECT_OK(comm.AllReduce(nullptr, 0, DType::kF32, ReduceOp::kSum).Wait()); });
}

TEST(Args, CreateGlooRejectsBadRankAndStore) {
  EXPECT_THAT(Communicator::CreateGloo(Store::Hash(), 2, 2), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Communicator::CreateGloo(nullptr, 0, 1), StatusIs(absl::StatusCode::kInvalidArgument));
  CommOptions zero_timeout;
  zero_timeout.timeout = absl::ZeroDuration();
  EXPECT_THAT(Communicator::CreateGloo(Store::Hash(), 0, 1, zero_timeout),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // Beyond what Gloo's nanosecond deadlines hold (issue 32.4: every rendezvous timed out at once at 9.3e9 s), or
  // below the stores' millisecond resolution: refused with the range.
  for (absl::Duration d : {absl::Seconds(9.3e9), absl::InfiniteDuration(), absl::Microseconds(10)}) {
    CommOptions o;
    o.timeout = d;
    EXPECT_THAT(
        Communicator::CreateGloo(Store::Hash(), 0, 1, o),
        StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("must be in [0.001, 1e+09] seconds")));
  }
}

}  // namespace
}  // namespace zero
