// Running out of resources: an allocation that cannot be had — over the tracker's budget
// (MemoryTracker::SetLimit, the injected limit) or refused by the allocator itself (RLIMIT_AS) — at Finalize and in
// the middle of training is an error that names the unit, the buffer and the bytes, never a crash; and what a rank
// holds besides memory (file descriptors, threads) is fixed once it is set up: training and checkpoints add none,
// and everything is given back when the engine and its communicator go (docs/internals/design.md, "Running out of
// memory"; docs/internals/comm.md, "What a rank holds").
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "support/engine_helpers.h"
#include "support/files.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "support/synthetic_trainer.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/engine.h"
#include "zero/memory.h"

namespace zero {
namespace {

using ::testing::AllOf;
using testing::Borrow;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using testing::TrainConfig;

Status FinalizeSynthetic(Engine& e) {
  return e.Finalize([](const std::string& unit, const ParamSpec& p, float* out) {
    for (int64_t i = 0; i < p.numel(); ++i) out[i] = testing::SyntheticInit(unit, p.name, i);
  });
}

// A budget smaller than the model state on one rank: that rank's Finalize names the unit, the buffer and the
// bytes; the others fail too, naming the rank, instead of going on into the initial values' collectives and
// waiting there for it until the timeout.
TEST(OutOfMemoryTest, FinalizeOverBudgetFailsOnEveryRankNamingUnitAndBytes) {
  for (int stage : {0, 2, 3}) {
    SCOPED_TRACE(absl::StrCat("stage ", stage));
    testing::RunRanks(3, [&](Communicator& comm, int rank) {
      ASSERT_OK_AND_ASSIGN(auto e, Engine::Create(TrainConfig(stage, 1), Borrow(comm)));
      for (const auto& [name, specs] : testing::SyntheticUnits()) ASSERT_OK(e->AddUnit(name, specs).status());
      // Less than any stage's model state of the four units (1,056 to 3,000 elements per rank).
      if (rank == 1) e->memory_tracker().SetLimit(MemTier::kDevice, 6000);
      const Status s = FinalizeSynthetic(*e);
      if (rank == 1) {
        EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
        EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("Finalize on rank 1"),
                                                    ContainsRegex("unit [abcd] \\([1-4] of 4\\), its [a-z_]+ "
                                                                  "\\([0-9]+ bytes\\)"),
                                                    HasSubstr("budget of 6000 bytes")));
        // Nothing was counted for the buffer that was not made.
        EXPECT_LE(e->memory_tracker().total(MemTier::kDevice), 6000);
      } else {
        EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
        EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("failed on rank 1"), ContainsRegex("unit [abcd] ")));
      }
    });
  }
}

// A budget that holds the model state but not the first step's transient buffers: the stage-3 gather buffer or
// the stage-2 gradient bucket cannot be had. The rank returns an error naming that buffer, its unit and its bytes
// before issuing the collective (no rank gets a null buffer), keeps returning it (the engine is done, as after a
// device error), and the other ranks fail rather than hang.
TEST(OutOfMemoryTest, MidTrainingOverBudgetIsAnErrorNamingTheBuffer) {
  struct Case {
    int stage;
    const char* buffer;
    const char* unit;
  };
  for (const Case& c : {Case{3, "gather buffer of unit a", "a"}, Case{2, "gradient bucket of unit d", "d"}}) {
    SCOPED_TRACE(absl::StrCat("stage ", c.stage));
    testing::RunRanksOptions o;
    o.comm.timeout = absl::Seconds(3);
    testing::RunRanks(
        2,
        [&](Communicator& comm, int rank) {
          ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(TrainConfig(c.stage, 1), Borrow(comm)));
          if (rank == 1) {
            MemoryTracker& t = e->memory_tracker();
            t.SetLimit(MemTier::kDevice, t.total(MemTier::kDevice) + 64);
          }
          const UnitId a = e->FindUnit("a"), d = e->FindUnit("d");
          Status first = [&]() -> Status {
            for (const auto& [name, specs] : testing::SyntheticUnits()) {
              ZERO_RETURN_IF_ERROR(e->Forward(e->FindUnit(name)).status());
            }
            for (UnitId id : {d, e->FindUnit("c"), e->FindUnit("b"), a}) {
              ZERO_RETURN_IF_ERROR(e->Backward(id).status());
            }
            return e->Step().status();
          }();
          ASSERT_FALSE(first.ok()) << "rank " << rank << " trained a step";
          if (rank != 1) return;  // a peer: an error (its collective's timeout or a closed link), not a hang
          EXPECT_EQ(first.code(), absl::StatusCode::kResourceExhausted) << first;
          EXPECT_THAT(std::string(first.message()),
                      AllOf(HasSubstr(c.buffer), HasSubstr(" bytes"), HasSubstr("budget of"),
                            HasSubstr("MemoryTracker::SetLimit")));
          // Sticky: the engine does not go on as if the buffer were there.
          EXPECT_FALSE(e->Step().ok());
        },
        o);
  }
}

// RLIMIT_AS: the allocator itself refuses (malloc returns null), at Finalize and, with the limit lowered after
// Finalize, at the first stage-3 gather. Each case runs in a child process (a death test), whose address space
// the limit shrinks; the child prints the engine's error and exits 0 only if it is the expected one.
// AddressSanitizer and ThreadSanitizer reserve terabytes of address space at start, so RLIMIT_AS cannot apply.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kAddressSpaceLimitWorks = false;
#else
constexpr bool kAddressSpaceLimitWorks = true;
#endif

int64_t AddressSpaceBytes() {
  std::ifstream in("/proc/self/statm");
  int64_t pages = 0;
  in >> pages;
  return pages * sysconf(_SC_PAGESIZE);
}

void LimitAddressSpace(int64_t more_bytes) {
  const rlim_t limit = static_cast<rlim_t>(AddressSpaceBytes() + more_bytes);
  rlimit r{limit, limit};
  if (setrlimit(RLIMIT_AS, &r) != 0) std::_Exit(3);
}

// One 64 Mi-element unit (256 MiB in fp32) on one rank: `stage` 0 allocates it whole at Finalize; stage 3 holds it
// as the (whole) shard and gathers it into a second buffer of the same size at the first Forward.
void TrainBigUnitUnderAddressLimit(int stage, bool limit_before_finalize) {
  constexpr int64_t kBig = int64_t{64} << 20;
  testing::RunRanks(1, [&](Communicator& comm, int) {
    auto e = Engine::Create(TrainConfig(stage, 1), Borrow(comm));
    if (!e.ok()) std::_Exit(4);
    if (!(*e)->AddUnit("big", {{"w", {kBig}}}).ok()) std::_Exit(5);
    // Room for the threads and small allocations, never for a quarter-GiB buffer.
    if (limit_before_finalize) LimitAddressSpace(int64_t{96} << 20);
    Status s = (*e)->Finalize([](const std::string&, const ParamSpec& p, float* out) {
      for (int64_t i = 0; i < p.numel(); ++i) out[i] = 0.0f;
    });
    if (s.ok() && !limit_before_finalize) {
      LimitAddressSpace(int64_t{96} << 20);
      s = (*e)->Forward((*e)->FindUnit("big")).status();
    }
    std::fprintf(stderr, "engine: %s\n", s.ToString().c_str());
    std::_Exit(s.code() == absl::StatusCode::kResourceExhausted ? 0 : 6);
  });
  std::_Exit(7);
}

TEST(OutOfMemoryDeathTest, AddressSpaceLimitAtFinalizeIsAnError) {
  if (!kAddressSpaceLimitWorks) GTEST_SKIP() << "RLIMIT_AS does not apply under a sanitizer";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(TrainBigUnitUnderAddressLimit(0, /*limit_before_finalize=*/true), ::testing::ExitedWithCode(0),
              "unit big \\(1 of 1\\), its params \\(268435456 bytes\\).*the allocator failed");
}

TEST(OutOfMemoryDeathTest, AddressSpaceLimitAtTheFirstGatherIsAnError) {
  if (!kAddressSpaceLimitWorks) GTEST_SKIP() << "RLIMIT_AS does not apply under a sanitizer";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(TrainBigUnitUnderAddressLimit(3, /*limit_before_finalize=*/false), ::testing::ExitedWithCode(0),
              "gather buffer of unit big \\(268435456 bytes\\).*the allocator failed");
}

// File descriptors and threads of this process.
int CountEntries(const char* dir) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    (void)entry;
    ++n;
  }
  return n;
}
struct Held {
  int fds = 0, threads = 0;
};
Held HeldNow() { return {CountEntries("/proc/self/fd"), CountEntries("/proc/self/task")}; }

// What a rank holds is fixed once its communicator and engine are set up: steps, stage-3 gathers, chunked
// collectives and a checkpoint's save and load open no descriptor and start no thread that stays; all of it is
// released with the engine and the communicator. docs/internals/comm.md ("What a rank holds") gives the counts per
// rank.
TEST(RankResourcesTest, FixedAfterSetUpAndReleasedAtTheEnd) {
  const Held before = HeldNow();
  const std::string dir = testing::MakeTempDir("resources");
  for (int world : {2, 4}) {
    SCOPED_TRACE(absl::StrCat("world ", world));
    Held set_up, trained;
    Config cfg = TrainConfig(3, 1);
    cfg.zero.allgather_bucket_size = cfg.zero.reduce_bucket_size = 256;  // chunked collectives too
    testing::RunRanks(world, [&](Communicator& comm, int rank) {
      ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, Borrow(comm)));
      testing::SyntheticTrace t;
      ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, 2, 1, testing::HostViewIo(), &t));
      ASSERT_OK(comm.Barrier().Wait());
      if (rank == 0) set_up = HeldNow();
      ASSERT_OK(comm.Barrier().Wait());
      ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, 5, 1, testing::HostViewIo(), &t, 2));
      ASSERT_OK(e->Save(absl::StrCat(dir, "/w", world)).status());
      ASSERT_OK(e->Load(absl::StrCat(dir, "/w", world)));
      ASSERT_OK(comm.Barrier().Wait());
      if (rank == 0) trained = HeldNow();
      ASSERT_OK(comm.Barrier().Wait());
    });
    EXPECT_EQ(trained.fds, set_up.fds);
    EXPECT_EQ(trained.threads, set_up.threads);
    // docs/internals/comm.md, "What a rank holds": per rank, Gloo's transport holds one epoll instance and a socket per
    // peer for each of the communicator's two Gloo contexts; its threads are Gloo's transport loop and the
    // communicator's executor, with the optimizer's workers (cpu_threads - 1; cpu_threads defaults to the cores
    // per rank) and the rank's own thread here.
    const int cpu_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / world);
    EXPECT_EQ(set_up.fds - before.fds, world * (1 + 2 * (world - 1))) << "descriptors held by " << world << " ranks";
    EXPECT_LE(set_up.threads - before.threads, world * (3 + cpu_threads - 1))
        << "threads held by " << world << " ranks";
  }
  const Held after = HeldNow();
  EXPECT_EQ(after.fds, before.fds);
  EXPECT_EQ(after.threads, before.threads);
}

}  // namespace
}  // namespace zero
