// Stores: Hash (threads), File (processes: the flock'd Add is tested across fork), TCP (a real server and
// clients), and Gloo rendezvous over each.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/internal/store_protocol.h"
#include "support/files.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "zero/communicator.h"
#include "zero/store.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using ::zero::testing::StatusIs;

std::vector<uint8_t> Bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

std::string TempDir(const std::string& name) { return zero::testing::MakeTempDir(name); }

void ExerciseStore(Store& store) {
  ASSERT_OK(store.Set("a", Bytes("hello")));
  auto v = store.Get("a", absl::Seconds(1));
  ASSERT_OK(v);
  EXPECT_EQ(*v, Bytes("hello"));
  // Write-once keys.
  Status again = store.Set("a", Bytes("other"));
  EXPECT_THAT(again, StatusIs(absl::StatusCode::kAlreadyExists));
  // A missing key times out naming the key.
  auto missing = store.Get("never", absl::Milliseconds(50));
  EXPECT_THAT(missing, StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("never")));
  // Counters.
  EXPECT_EQ(*store.Add("c", 5), 5);
  EXPECT_EQ(*store.Add("c", -2), 3);
  EXPECT_EQ(*store.Add("d", 1), 1);
  // Empty values round-trip.
  ASSERT_OK(store.Set("empty", {}));
  // A counter that would overflow int64 is an error naming it, and keeps its value.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(*store.Add("big", kMax), kMax);
  EXPECT_THAT(store.Add("big", 1), StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("'big'")));
  EXPECT_EQ(*store.Add("big", -1), kMax - 1);
  EXPECT_EQ(*store.Add("small", std::numeric_limits<int64_t>::min()), std::numeric_limits<int64_t>::min());
  EXPECT_THAT(store.Add("small", -1), StatusIs(absl::StatusCode::kOutOfRange));
}

TEST(Store, Hash) { ExerciseStore(*Store::Hash()); }

TEST(Store, File) {
  const std::string dir = TempDir("zero-store");
  ExerciseStore(*Store::File(dir));
  std::filesystem::remove_all(dir);
}

TEST(Store, FileInUncreatableDirectoryFailsEveryCall) {
  auto store = Store::File("/proc/zero-cannot-create-this");
  Status s = store->Set("k", Bytes("v"));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("/proc/zero-cannot-create-this")));
  EXPECT_FALSE(store->Add("k", 1).ok());
  EXPECT_FALSE(Communicator::CreateGloo(store, 0, 2, testing::TestCommOptions()).ok());
}

TEST(Store, FileAddIsAtomicAcrossProcesses) {
  const std::string dir = TempDir("zero-store-add");
  constexpr int kProcs = 4;
  constexpr int kAdds = 200;
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcs; ++p) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto store = Store::File(dir);
      for (int i = 0; i < kAdds; ++i) {
        if (!store->Add("counter", 1).ok()) ::_exit(2);
      }
      ::_exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_EQ(*Store::File(dir)->Add("counter", 0), kProcs * kAdds);
  std::filesystem::remove_all(dir);
}

// A process killed in the middle of an Add (live recovery's rank marking its group lost, as zero-run SIGKILLs the
// group) must leave the counter at its value before or after that Add, never lose it: the live-recovery vote read an
// emptied counter as 0, and waited its whole timeout for a group zero-run had already marked lost. A child adds in a
// loop, reporting each value it got through a pipe; it is killed after a few hundred microseconds, 60 times over.
TEST(Store, FileAddSurvivesAProcessKilledInTheMiddle) {
  const std::string dir = TempDir("zero-store-add-kill");
  int64_t expected = 0;  // the last value a killed child reported, or one more (the Add it was killed in, done)
  for (int round = 0; round < 60; ++round) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      auto store = Store::File(dir);
      for (;;) {
        StatusOr<int64_t> v = store->Add("counter", 1);
        if (!v.ok()) ::_exit(2);
        const int64_t got = *v;
        if (::write(fds[1], &got, sizeof(got)) != sizeof(got)) ::_exit(3);
      }
    }
    ::close(fds[1]);
    ::usleep(200 + 37 * static_cast<useconds_t>(round % 11));
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the child exited by itself: status " << status;
    int64_t got = 0, last = expected;
    while (::read(fds[0], &got, sizeof(got)) == sizeof(got)) last = got;
    ::close(fds[0]);
    const int64_t now = *Store::File(dir)->Add("counter", 0);
    ASSERT_TRUE(now == last || now == last + 1)
        << "round " << round << ": the counter reads " << now << " after the child last got " << last;
    expected = now;
  }
  std::filesystem::remove_all(dir);
}

TEST(Store, Tcp) {
  auto server = Store::Tcp("127.0.0.1", 0, /*is_server=*/true, absl::Seconds(5));
  ASSERT_OK(server);
  const int port = (*server)->port();
  ASSERT_GT(port, 0);
  ExerciseStore(**server);
  auto client = Store::Tcp("127.0.0.1", port, /*is_server=*/false, absl::Seconds(5));
  ASSERT_OK(client);
  // The client sees the server's keys and shares its counters.
  EXPECT_EQ(*(*client)->Get("a", absl::Seconds(1)), Bytes("hello"));
  EXPECT_EQ(*(*client)->Add("c", 10), 13);
  // A Get blocks until another client sets the key.
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_OK((*server)->Set("late", Bytes("x")));
  });
  auto late = (*client)->Get("late", absl::Seconds(10));
  setter.join();
  ASSERT_OK(late);
  EXPECT_EQ(*late, Bytes("x"));
}

TEST(Store, TcpClientWithoutServerTimesOut) {
  // Bind-and-release a port so nothing listens there.
  auto probe = Store::Tcp("127.0.0.1", 0, true, absl::Seconds(1));
  ASSERT_OK(probe);
  const int port = (*probe)->port();
  probe->reset();
  auto client = Store::Tcp("127.0.0.1", port, false, absl::Milliseconds(300));
  EXPECT_THAT(client, StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr(absl::StrCat(port))));
}

TEST(Store, TcpClientSeesServerLoss) {
  auto server = Store::Tcp("127.0.0.1", 0, true, absl::Seconds(5));
  ASSERT_OK(server);
  auto client = Store::Tcp("127.0.0.1", (*server)->port(), false, absl::Seconds(5));
  ASSERT_OK(client);
  server->reset();
  auto v = (*client)->Get("k", absl::Seconds(5));
  EXPECT_THAT(v, StatusIs(absl::StatusCode::kUnavailable));
}

// Rendezvous over each kind of store, then one collective to prove the contexts are connected.
void RendezvousOver(const std::vector<std::shared_ptr<Store>>& stores) {
  const int world = static_cast<int>(stores.size());
  testing::RunThreads(world, [&](int rank) {
    auto comm = Communicator::CreateGloo(stores[rank], rank, world, testing::TestCommOptions());
    ASSERT_OK(comm);
    std::vector<float> v(10, static_cast<float>(rank));
    ASSERT_OK((*comm)->AllReduce(v.data(), v.size(), DType::kF32, ReduceOp::kSum).Wait());
    EXPECT_EQ(v[0], static_cast<float>(world * (world - 1) / 2));
  });
}

TEST(Store, GlooRendezvousOverFileStore) {
  const std::string dir = TempDir("zero-store-gloo");
  RendezvousOver({Store::File(dir), Store::File(dir), Store::File(dir)});
  // A second generation of communicators on the same directory gets fresh keys.
  RendezvousOver({Store::File(dir), Store::File(dir), Store::File(dir)});
  std::filesystem::remove_all(dir);
}

TEST(Store, GlooRendezvousOverTcpStore) {
  auto server = Store::Tcp("127.0.0.1", 0, true, absl::Seconds(5));
  ASSERT_OK(server);
  std::vector<std::shared_ptr<Store>> stores = {*server};
  for (int r = 1; r < 3; ++r) {
    auto c = Store::Tcp("127.0.0.1", (*server)->port(), false, absl::Seconds(5));
    ASSERT_OK(c);
    stores.push_back(*c);
  }
  RendezvousOver(stores);
}

// The TCP store's protocol without sockets (fuzz/store_protocol_fuzzer.cc drives the same state with any bytes).
TEST(StoreProtocol, RequestsSplitAnywhereGetTheSameAnswers) {
  using namespace internal;  // NOLINT(build/namespaces)
  const std::string stream = EncodeStoreRequest(kStoreCmdGet, "k", StoreI64Payload(-1)) +
                             EncodeStoreRequest(kStoreCmdAdd, "n", StoreI64Payload(7)) +
                             EncodeStoreRequest(9, "x", "") + EncodeStoreRequest(kStoreCmdGet, "k", "short");
  const absl::Time t0 = absl::UnixEpoch();
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    StoreServerState s;
    ASSERT_TRUE(s.Receive(1, std::string_view(stream).substr(0, cut), t0));
    ASSERT_TRUE(s.Receive(1, std::string_view(stream).substr(cut), t0));
    EXPECT_EQ(s.waiting(), 1u);  // the GET of a missing key with no timeout waits
    EXPECT_EQ(s.NextDeadline(), absl::InfiniteFuture());
    ASSERT_TRUE(s.Receive(2, EncodeStoreRequest(kStoreCmdSet, "k", "v"), t0));
    EXPECT_EQ(s.Output(2), EncodeStoreResponse(kStoreCodeOk, ""));
    EXPECT_EQ(s.Output(1), EncodeStoreResponse(kStoreCodeOk, StoreI64Payload(7)) +
                               EncodeStoreResponse(kStoreCodeBadRequest, "") +
                               EncodeStoreResponse(kStoreCodeBadRequest, "") + EncodeStoreResponse(kStoreCodeOk, "v"))
        << "cut at " << cut;
  }
}

TEST(StoreProtocol, DeadlinesAndOversizedLengths) {
  using namespace internal;  // NOLINT(build/namespaces)
  const absl::Time t0 = absl::UnixEpoch();
  StoreServerState s;
  ASSERT_TRUE(s.Receive(1, EncodeStoreRequest(kStoreCmdGet, "a", StoreI64Payload(5)), t0));
  ASSERT_TRUE(s.Receive(2, EncodeStoreRequest(kStoreCmdGet, "a", StoreI64Payload(INT64_MAX)), t0));
  EXPECT_EQ(s.NextDeadline(), t0 + absl::Milliseconds(5));
  s.Expire(t0 + absl::Milliseconds(4));
  EXPECT_FALSE(s.HasOutput(1));
  s.Expire(t0 + absl::Milliseconds(5));
  EXPECT_EQ(s.Output(1), EncodeStoreResponse(kStoreCodeTimeout, ""));
  EXPECT_FALSE(s.HasOutput(2));
  s.Close(2);
  EXPECT_EQ(s.waiting(), 0u);
  // A key or payload length over the limit is a protocol error before any of it arrives.
  std::string huge_key = EncodeStoreRequest(kStoreCmdSet, "", "");
  huge_key[4] = 0x7F;  // key_len 0x7F000000
  EXPECT_FALSE(s.Receive(3, huge_key.substr(0, 5), t0));
  StoreRequest req;
  size_t size = 0;
  std::string huge_payload = EncodeStoreRequest(kStoreCmdSet, "k", "");
  huge_payload[6 + 7] = 1;  // payload_len 2^56
  EXPECT_EQ(DecodeStoreRequest(huge_payload, &req, &size), StoreDecode::kMalformed);
  EXPECT_EQ(DecodeStoreRequest(huge_payload.substr(0, 9), &req, &size), StoreDecode::kIncomplete);

  // poll()'s timeout: rounded up, never negative, and a far deadline never wraps (2^32 ms once became 0: a spin).
  EXPECT_EQ(PollTimeoutMs(absl::InfiniteFuture(), t0), -1);
  EXPECT_EQ(PollTimeoutMs(t0 - absl::Seconds(1), t0), 0);
  EXPECT_EQ(PollTimeoutMs(t0 + absl::Microseconds(1500), t0), 2);
  EXPECT_EQ(PollTimeoutMs(t0 + absl::Milliseconds(int64_t{1} << 32), t0), 24 * 3600 * 1000);
  EXPECT_EQ(PollTimeoutMs(t0 + absl::Milliseconds(INT64_MAX), t0), 24 * 3600 * 1000);
}

TEST(Store, SeveralCommunicatorsOnOneHashStore) {
  auto store = Store::Hash();
  for (int round = 0; round < 3; ++round) RendezvousOver({store, store});
}

}  // namespace
}  // namespace zero
