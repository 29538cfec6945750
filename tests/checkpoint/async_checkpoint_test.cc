// Asynchronous checkpoints (SaveOptions::async): an async save writes the same bytes a synchronous save of the
// same state writes, and loads to the same run, at stages 0-3 with and without offload, while training goes on
// during the background write; a save in flight is waited for or refused as asked, Step only looks, Load waits;
// a background write that fails on one rank (a real error: the file system refuses it) is reported by the next
// call on every rank and never becomes `latest`.
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/reshard_check.h"
#include "shard/internal/async_save.h"
#include "support/files.h"
#include "zero/checkpoint.h"
#include "zero/engine.h"
#include "zero/estimate.h"
#include "zero/sharded_optimizer.h"

namespace zero {
namespace {

using testing::ReadWholeFile;

StatusOr<int64_t> FileBytes(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return absl::NotFoundError(path);
  return static_cast<int64_t>(st.st_size);
}
bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

class AsyncSaveTest : public ::testing::TestWithParam<Case> {};

// One run saves synchronously after 3 steps; another, asynchronously, and trains 3 more steps while the file is
// written, then waits. Every file of the two checkpoints is the same, byte for byte (meta.json too); the async
// run's steps equal an unsaved run's; a fresh engine loading the async checkpoint continues as the unsaved run.
TEST_P(AsyncSaveTest, AsyncSaveEqualsSyncSaveOfTheSameState) {
  const Case& c = GetParam();
  const Config cfg = CaseConfig(c);
  const std::string sync_dir = MakeTempDir(), async_dir = MakeTempDir();
  constexpr int kFirst = 3, kSecond = 3;
  testing::RunRanks(c.world, [&](Communicator& comm, int rank) {
    SyntheticTrace straight, with_sync, before, during, resumed;
    {
      ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, Borrow(comm)));
      ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, kFirst + kSecond, c.ga, testing::HostViewIo(), &straight));
    }
    {
      ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, Borrow(comm)));
      ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, kFirst, c.ga, testing::HostViewIo(), &with_sync));
      ASSERT_OK(e->Save(sync_dir, {.trainer_state = {{"pos", std::to_string(100 + rank)}}}).status());
    }
    {
      ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, Borrow(comm)));
      ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, kFirst, c.ga, testing::HostViewIo(), &before));
      const int64_t staging_before = e->memory_report().Get(MemTier::kHost, MemTag::kStaging).current;
      ASSERT_OK_AND_ASSIGN(std::string tag,
                           e->Save(async_dir, {.trainer_state = {{"pos", std::to_string(100 + rank)}}, .async = true}));
      EXPECT_EQ(tag, "step-00000003");
      EXPECT_TRUE(e->save_in_flight());
      // The staging stays allocated, counted under kStaging, for the next save.
      EXPECT_GT(e->memory_report().Get(MemTier::kHost, MemTag::kStaging).current, staging_before);
      ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, kSecond, c.ga, testing::HostViewIo(), &during, kFirst));
      ASSERT_OK(e->WaitForSave());
      EXPECT_FALSE(e->save_in_flight());
      ASSERT_OK(e->WaitForSave());  // nothing in flight: nothing to report
    }
    std::vector<StepResult> joined = before.steps;
    joined.insert(joined.end(), during.steps.begin(), during.steps.end());
    ExpectSameSteps(straight.steps, joined);
    ExpectSameParams(straight, during);
    {
      ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, Borrow(comm)));
      ASSERT_OK_AND_ASSIGN(LoadResult r, e->Load(async_dir));
      EXPECT_EQ(r.step, kFirst);
      EXPECT_EQ(r.trainer_state.at("pos"), std::to_string(100 + rank));
      ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, kSecond, c.ga, testing::HostViewIo(), &resumed, kFirst));
    }
    ExpectSameSteps(during.steps, resumed.steps);
    ExpectSameParams(straight, resumed);
  });
  if (HasFailure()) return;
  ASSERT_OK(VerifyCheckpoint(async_dir));
  ASSERT_OK_AND_ASSIGN(std::string latest, LatestCheckpointTag(async_dir));
  EXPECT_EQ(latest, "step-00000003");
  const std::string tag = "/step-00000003/";
  ASSERT_OK_AND_ASSIGN(auto listed, UnlistedCheckpointFiles(async_dir));
  EXPECT_TRUE(listed.empty());
  EXPECT_EQ(ReadWholeFile(sync_dir + tag + "meta.json"), ReadWholeFile(async_dir + tag + "meta.json"));
  const int writers = c.world;
  for (int r = 0; r < writers; ++r) {
    char name[64];
    std::snprintf(name, sizeof(name), "rank-%05d-of-%05d.bin", r, writers);
    const std::string a = ReadWholeFile(sync_dir + tag + name), b = ReadWholeFile(async_dir + tag + name);
    EXPECT_FALSE(a.empty()) << name;
    EXPECT_TRUE(a == b) << name << ": the async save's file differs from the sync save's (" << a.size() << " vs "
                        << b.size() << " bytes)";
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, AsyncSaveTest,
                         ::testing::Values(Case{"s0_f32", 2, 0}, Case{"s1_f32", 2, 1}, Case{"s2_f32", 3, 2},
                                           Case{"s3_f32", 2, 3}, Case{"s2_bf16_ga2", 2, 2, DType::kBF16, 2},
                                           Case{"s3_bf16_sr", 3, 3, DType::kBF16, 1, false, true},
                                           Case{"s1_f32_offload", 2, 1, DType::kF32, 1, true},
                                           Case{"s2_bf16_offload_ga2", 2, 2, DType::kBF16, 2, true},
                                           Case{"s3_bf16_offload", 2, 3, DType::kBF16, 1, true},
                                           Case{"s3_f32_offload_ga2", 3, 3, DType::kF32, 2, true}),
                         [](const auto& info) { return std::string(info.param.name); });

// Hybrid sharding (4 ranks, groups of 2): the first group writes, the second only agrees; the same files as a
// synchronous save (a checkpoint of a world of 2), and the estimate counts staging on the writers only.
TEST(AsyncSaveBehaviourTest, HybridShardingWritesFromTheFirstGroup) {
  Config cfg = TrainConfig(2, 1);
  cfg.zero.mics_shard_size = 2;
  const std::string sync_dir = MakeTempDir(), async_dir = MakeTempDir();
  testing::RunRanks(4, [&](Communicator& comm, int) {
    for (const bool async : {false, true}) {
      ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, Borrow(comm)));
      SyntheticTrace t;
      ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, 2, 1, testing::HostViewIo(), &t));
      const int64_t staging_before = e->memory_report().Get(MemTier::kHost, MemTag::kStaging).current;
      ASSERT_OK(e->Save(async ? async_dir : sync_dir, {.async = async}).status());
      ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, 1, 1, testing::HostViewIo(), &t, 2));
      ASSERT_OK(e->WaitForSave());
      if (async && e->rank() >= 2) {  // the second group holds no staging
        EXPECT_EQ(e->memory_report().Get(MemTier::kHost, MemTag::kStaging).current, staging_before);
      }
    }
  });
  for (const char* f : {"meta.json", "rank-00000-of-00002.bin", "rank-00001-of-00002.bin"}) {
    const std::string p = std::string("/step-00000002/") + f;
    EXPECT_TRUE(ReadWholeFile(sync_dir + p) == ReadWholeFile(async_dir + p)) << f;
    EXPECT_FALSE(ReadWholeFile(async_dir + p).empty()) << f;
  }
}

// Holds rank `rank`'s background writes at their start (internal::AsyncSaveTestHook) while armed, until
// Release(); the writes themselves are real.
class HeldWrite {
 public:
  explicit HeldWrite(int rank) : rank_(rank) {
    internal::AsyncSaveTestHook() = [this](int r) {
      std::unique_lock<std::mutex> lock(mu_);
      if (r == rank_) cv_.wait(lock, [this] { return released_; });
    };
  }
  ~HeldWrite() {
    Release();
    internal::AsyncSaveTestHook() = nullptr;
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  int rank_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
};

// A folder where rank `rank`'s file of `tag` must go: its rename fails (a real error of the file system).
void BlockRankFile(const std::string& dir, const std::string& tag, int rank, int world) {
  char name[64];
  std::snprintf(name, sizeof(name), "/rank-%05d-of-%05d.bin", rank, world);
  const std::string f = dir + "/" + tag + name;
  ::mkdir((dir + "/" + tag).c_str(), 0755);
  ZERO_CHECK(::mkdir(f.c_str(), 0755) == 0) << f;
  ZERO_CHECK(::mkdir((f + "/x").c_str(), 0755) == 0) << f;
}

// Rank 1's write of "second" is held: Save returned on both ranks, the save stays in flight across Steps (which
// only look), a Save that refuses is refused on both ranks, and once released the write fails: WaitForSave
// reports it on every rank naming rank 1, `latest` still names "first", and a later save works.
TEST(AsyncSaveBehaviourTest, InFlightSavesAreRefusedOrWaitedForAndFailuresReachEveryRank) {
  const std::string dir = MakeTempDir();
  std::unique_ptr<HeldWrite> held;
  testing::RunRanks(2, [&](Communicator& comm, int rank) {
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(TrainConfig(2, 1), Borrow(comm)));
    SyntheticTrace t;
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, 1, 1, testing::HostViewIo(), &t));
    ASSERT_OK(e->Save(dir, {.tag = "first", .async = true}).status());
    ASSERT_OK(e->WaitForSave());
    ASSERT_OK(comm.Barrier().Wait());
    if (rank == 1) {
      held = std::make_unique<HeldWrite>(1);
      BlockRankFile(dir, "second", 1, 2);
    }
    ASSERT_OK(comm.Barrier().Wait());
    ASSERT_OK(e->Save(dir, {.tag = "second", .async = true}).status());
    EXPECT_TRUE(e->save_in_flight());
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, 2, 1, testing::HostViewIo(), &t, 1));
    EXPECT_TRUE(e->save_in_flight()) << "a Step waited for the held write";
    auto refused = e->Save(dir, {.tag = "third", .async = true, .if_in_flight = SaveOptions::InFlight::kRefuse});
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
    EXPECT_NE(std::string(refused.status().message()).find("still being written"), std::string::npos);
    EXPECT_TRUE(e->save_in_flight());
    ASSERT_OK(comm.Barrier().Wait());
    if (rank == 1) held->Release();
    const Status failed = e->WaitForSave();
    EXPECT_FALSE(failed.ok());
    EXPECT_NE(std::string(failed.message()).find("failed on rank 1"), std::string::npos) << failed;
    EXPECT_NE(std::string(failed.message()).find(dir + "/second"), std::string::npos) << failed;
    EXPECT_FALSE(e->save_in_flight());
    ASSERT_OK(e->WaitForSave());  // reported once
    ASSERT_OK_AND_ASSIGN(std::string latest, LatestCheckpointTag(dir));
    EXPECT_EQ(latest, "first");
    ASSERT_OK(comm.Barrier().Wait());
    if (rank == 1) held.reset();
    ASSERT_OK(comm.Barrier().Wait());
    // A new save goes through; Load waits for it and loads it.
    ASSERT_OK(e->Save(dir, {.tag = "fourth", .async = true}).status());
    ASSERT_OK_AND_ASSIGN(LoadResult r, e->Load(dir));
    EXPECT_EQ(r.tag, "fourth");
    EXPECT_EQ(r.step, 3);
  });
  ASSERT_OK_AND_ASSIGN(std::string latest, LatestCheckpointTag(dir));
  EXPECT_EQ(latest, "fourth");
  ASSERT_OK(VerifyCheckpoint(dir));
  ASSERT_OK(VerifyCheckpoint(dir, "first"));
  EXPECT_FALSE(VerifyCheckpoint(dir, "second").ok());
}

// A Step finds a failed write (without waiting for anything): the failure is kept and returned by the next Save on
// every rank, which then does not start; the one after it does.
TEST(AsyncSaveBehaviourTest, AFailureAStepFindsIsReturnedByTheNextSave) {
  const std::string dir = MakeTempDir();
  BlockRankFile(dir, "second", 0, 2);
  testing::RunRanks(2, [&](Communicator& comm, int) {
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(TrainConfig(1, 1), Borrow(comm)));
    SyntheticTrace t;
    ASSERT_OK(e->Save(dir, {.tag = "first"}).status());
    ASSERT_OK(e->Save(dir, {.tag = "second", .async = true}).status());
    // Steps until one finds the save finished (each Step looks; the write fails within moments).
    for (int k = 0; e->save_in_flight(); ++k) {
      ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, 1, 1, testing::HostViewIo(), &t, k));
      if (e->save_in_flight()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    auto next = e->Save(dir, {.tag = "third", .async = true});
    EXPECT_FALSE(next.ok());
    EXPECT_NE(std::string(next.status().message()).find("failed on rank 0"), std::string::npos) << next.status();
    EXPECT_FALSE(e->save_in_flight());
    ASSERT_OK(e->Save(dir, {.tag = "third", .async = true}).status());
    ASSERT_OK(e->WaitForSave());
  });
  ASSERT_OK_AND_ASSIGN(std::string latest, LatestCheckpointTag(dir));
  EXPECT_EQ(latest, "third");
  ASSERT_OK(VerifyCheckpoint(dir));
}

// One unit of 2^16 + 3000 f32 elements at stage 1: at world 2, rank 1 owns fewer elements than rank 0, so its
// rank file is the smaller.
StatusOr<std::unique_ptr<Engine>> MakeOneUnitEngine(Communicator& comm) {
  constexpr int64_t kN = (int64_t{1} << 16) + 3000;
  ZERO_ASSIGN_OR_RETURN(auto e, Engine::Create(TrainConfig(1, 1), Borrow(comm)));
  ZERO_RETURN_IF_ERROR(e->AddUnit("w", {{"v", {kN}}}).status());
  ZERO_RETURN_IF_ERROR(e->Finalize([](const std::string&, const ParamSpec& p, float* v) {
    for (int64_t i = 0; i < p.numel(); ++i) v[i] = 0.001f * static_cast<float>(i % 977);
  }));
  return e;
}

// A real write error: RLIMIT_FSIZE (no root needed, unlike a full tmpfs) set to the smaller of the two ranks' file
// sizes, so rank 0's larger file fails with EFBIG while rank 1's is written. WaitForSave fails on both ranks naming
// rank 0, `latest` keeps the first checkpoint, and no temporary file is left.
TEST(AsyncSaveBehaviourTest, AFileSizeLimitFailsTheSaveOnEveryRank) {
  const std::string dir = MakeTempDir();
  testing::RunRanks(2, [&](Communicator& comm, int) {
    ASSERT_OK_AND_ASSIGN(auto e, MakeOneUnitEngine(comm));
    ASSERT_OK(e->Save(dir, {.tag = "first", .async = true}).status());
    ASSERT_OK(e->WaitForSave());
  });
  ASSERT_OK_AND_ASSIGN(const int64_t size0, FileBytes(dir + "/first/rank-00000-of-00002.bin"));
  ASSERT_OK_AND_ASSIGN(const int64_t size1, FileBytes(dir + "/first/rank-00001-of-00002.bin"));
  ASSERT_GT(size0, size1) << "the test needs rank 0's file to be the larger";
  struct rlimit old_limit;
  ASSERT_EQ(0, ::getrlimit(RLIMIT_FSIZE, &old_limit));
  void (*old_handler)(int) = ::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of the signal
  struct rlimit lim = old_limit;
  lim.rlim_cur = static_cast<rlim_t>(size1);
  ASSERT_EQ(0, ::setrlimit(RLIMIT_FSIZE, &lim));
  testing::RunRanks(2, [&](Communicator& comm, int) {
    ASSERT_OK_AND_ASSIGN(auto e, MakeOneUnitEngine(comm));
    ASSERT_OK(e->Save(dir, {.tag = "second", .async = true}).status());
    const Status s = e->WaitForSave();
    EXPECT_FALSE(s.ok());
    EXPECT_NE(std::string(s.message()).find("failed on rank 0"), std::string::npos) << s;
    EXPECT_NE(std::string(s.message()).find("File too large"), std::string::npos) << s;
  });
  ASSERT_EQ(0, ::setrlimit(RLIMIT_FSIZE, &old_limit));
  ::signal(SIGXFSZ, old_handler);
  ASSERT_OK_AND_ASSIGN(std::string latest, LatestCheckpointTag(dir));
  EXPECT_EQ(latest, "first");
  ASSERT_OK(VerifyCheckpoint(dir));
  ASSERT_OK_AND_ASSIGN(auto unlisted, UnlistedCheckpointFiles(dir, "first"));
  EXPECT_TRUE(unlisted.empty());
  const Status v = VerifyCheckpoint(dir, "second");
  EXPECT_NE(std::string(v.message()).find("incomplete"), std::string::npos) << v;
  EXPECT_FALSE(FileExists(dir + "/second/rank-00000-of-00002.bin"));
  EXPECT_FALSE(FileExists(dir + "/second/rank-00000-of-00002.bin.tmp." + std::to_string(::getpid())));
}

// SaveOptions::writer_priority: the background thread runs at SCHED_IDLE by default and at the normal policy when
// asked (the hook runs on that thread). Both saves are complete checkpoints.
TEST(AsyncSaveBehaviourTest, TheWriterRunsAtTheAskedPriority) {
  const std::string dir = MakeTempDir();
  std::mutex mu;
  std::vector<int> policies;
  internal::AsyncSaveTestHook() = [&](int) {
    std::lock_guard<std::mutex> lock(mu);
    policies.push_back(::sched_getscheduler(0));
  };
  testing::RunRanks(1, [&](Communicator& comm, int) {
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(TrainConfig(1, 1), Borrow(comm)));
    ASSERT_OK(e->Save(dir, {.tag = "idle", .async = true}).status());
    ASSERT_OK(e->WaitForSave());
    ASSERT_OK(e->Save(dir, {.tag = "normal", .async = true, .writer_priority = SaveOptions::WriterPriority::kNormal})
                  .status());
    ASSERT_OK(e->WaitForSave());
  });
  internal::AsyncSaveTestHook() = nullptr;
  ASSERT_EQ(policies.size(), 2u);
  EXPECT_EQ(policies[0], SCHED_IDLE);
  EXPECT_EQ(policies[1], SCHED_OTHER);
  ASSERT_OK(VerifyCheckpoint(dir, "idle"));
  ASSERT_OK(VerifyCheckpoint(dir, "normal"));
}

// SaveOptions::max_write_bytes_per_s: the background thread writes the file in chunks of PacedChunkBytes, in order,
// each asked to start no earlier than its offset / rate after the first (the schedule, seen through the pace hook;
// how long the write then takes is the clock's business, not asserted), and the file is the unpaced save's, byte
// for byte. A negative rate on one rank fails the save on every rank, naming the option; the other rank's write,
// paced at 1 byte per second, is stopped and leaves no file. A write paced at 1 byte per second finishes at the
// disk's speed once WaitForSave waits for it (pacing spares the steps beside a write, not a trainer that waits).
TEST(AsyncSaveBehaviourTest, APacedWriteKeepsItsScheduleAndWritesTheSameFile) {
  const std::string dir = MakeTempDir();
  struct Chunk {
    int64_t offset, bytes;
    double not_before;
  };
  // Each rank's chunks, in the order its writer asked for them. Set before the ranks start and read after they
  // end: the ranks' threads never hand anything to each other but through the communicator.
  std::mutex mu;
  std::vector<Chunk> chunks[2];
  internal::AsyncSavePaceHook() = [&](int world_rank, int64_t offset, int64_t bytes, double not_before) {
    std::lock_guard<std::mutex> lock(mu);
    chunks[world_rank].push_back({offset, bytes, not_before});
  };
  // A rate whose chunk is 4 KiB (20 ms of it): the small model's file takes several.
  constexpr int64_t kRate = 50 * 4096;
  testing::RunRanks(2, [&](Communicator& comm, int rank) {
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(TrainConfig(0, 1), Borrow(comm)));
    SyntheticTrace t;
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, 1, 1, testing::HostViewIo(), &t));
    auto refused = e->Save(dir, {.tag = "negative", .async = true, .max_write_bytes_per_s = rank == 0 ? 1 : -1});
    EXPECT_EQ(refused.status().code(), rank == 1 ? absl::StatusCode::kInvalidArgument : absl::StatusCode::kAborted)
        << refused.status();
    EXPECT_NE(std::string(refused.status().message()).find("max_write_bytes_per_s is -1"), std::string::npos)
        << refused.status();
    EXPECT_FALSE(e->save_in_flight());
    ASSERT_OK(e->Save(dir, {.tag = "fast", .async = true}).status());
    ASSERT_OK(e->WaitForSave());
    ASSERT_OK(e->Save(dir, {.tag = "paced", .async = true, .max_write_bytes_per_s = kRate}).status());
    ASSERT_OK(e->WaitForSave());
    ASSERT_OK(e->Save(dir, {.tag = "crawling", .async = true, .max_write_bytes_per_s = 1}).status());
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, 1, 1, testing::HostViewIo(), &t, 1));
    EXPECT_TRUE(e->save_in_flight()) << "a file written at 1 byte per second, done within a step";
    ASSERT_OK(e->WaitForSave());
    ASSERT_OK_AND_ASSIGN(std::string latest, LatestCheckpointTag(dir));
    EXPECT_EQ(latest, "crawling");
  });
  internal::AsyncSavePaceHook() = nullptr;
  EXPECT_FALSE(FileExists(dir + "/negative/rank-00000-of-00002.bin"));
  EXPECT_FALSE(FileExists(dir + "/negative/rank-00000-of-00002.bin.tmp." + std::to_string(::getpid())));
  EXPECT_FALSE(FileExists(dir + "/negative/meta.json"));
  ASSERT_OK(VerifyCheckpoint(dir, "paced"));
  ASSERT_OK(VerifyCheckpoint(dir, "crawling"));
  const int64_t chunk = internal::PacedChunkBytes(kRate, 4096);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    ASSERT_OK_AND_ASSIGN(const int64_t bytes, FileBytes(absl::StrCat(dir, "/paced/rank-0000", r, "-of-00002.bin")));
    ASSERT_GE(bytes, 4 * chunk) << "the synthetic model's file is too small to be written in four chunks";
    // The writes, each starting at offset 0: rank 0's stopped "negative" one, then "paced" and "crawling".
    std::vector<std::vector<Chunk>> writes;
    for (const Chunk& c : chunks[r]) {
      if (c.offset == 0) writes.emplace_back();
      ASSERT_FALSE(writes.empty()) << "a write began at offset " << c.offset;
      writes.back().push_back(c);
    }
    ASSERT_EQ(writes.size(), r == 0 ? 3u : 2u);
    auto covered = [&](const std::vector<Chunk>& w, int64_t rate) {
      int64_t at = 0;
      for (const Chunk& c : w) {
        EXPECT_EQ(c.offset, at);
        EXPECT_LE(c.bytes, internal::PacedChunkBytes(rate, 4096)) << "at " << c.offset;
        EXPECT_DOUBLE_EQ(c.not_before, static_cast<double>(c.offset) / static_cast<double>(rate)) << "at " << c.offset;
        at += c.bytes;
      }
      return at;
    };
    if (r == 0) {
      EXPECT_LT(covered(writes[0], 1), bytes) << "the refused save's write was not stopped";
    }
    EXPECT_EQ(covered(writes[writes.size() - 2], kRate), bytes) << "the paced write does not cover the file";
    EXPECT_EQ(covered(writes.back(), 1), bytes) << "the hurried write does not cover the file";
  }
  for (const char* name : {"rank-00000-of-00002.bin", "rank-00001-of-00002.bin"}) {
    EXPECT_TRUE(ReadWholeFile(dir + "/fast/" + name) == ReadWholeFile(dir + "/paced/" + name)) << name;
  }
}

// PacedChunkBytes: about 20 ms of writing at the rate, aligned down, at least the alignment and at most 8 MiB.
TEST(AsyncSaveBehaviourTest, PacedChunksAreAboutTwentyMillisecondsAligned) {
  EXPECT_EQ(internal::PacedChunkBytes(int64_t{200} * 1000 * 1000, 4096), 4000000 / 4096 * 4096);
  EXPECT_EQ(internal::PacedChunkBytes(1, 4096), 4096);
  EXPECT_EQ(internal::PacedChunkBytes(50 * 4096 + 49, 4096), 4096);
  EXPECT_EQ(internal::PacedChunkBytes(50 * 3 * 4096 - 1, 4096), 2 * 4096);
  EXPECT_EQ(internal::PacedChunkBytes(int64_t{1} << 40, 4096), int64_t{8} << 20);
  EXPECT_EQ(internal::PacedChunkBytes(int64_t{200} * 1000 * 1000, 1 << 20), int64_t{3} << 20);
  EXPECT_EQ(internal::PacedChunkBytes(1, 1 << 20), int64_t{1} << 20);
}

// The file system full: a tmpfs sized to hold the first checkpoint and less than either rank's next file. Both
// ranks' background writes fail with ENOSPC; WaitForSave fails on both naming a rank and the error, `latest` keeps
// the first checkpoint, which still verifies, and no temporary file is left to fill the disk further. Mounting
// needs CAP_SYS_ADMIN (CI runs as root); without it the test is skipped, and the RLIMIT_FSIZE test above still
// checks a real write error.
TEST(AsyncSaveBehaviourTest, AFullFileSystemFailsTheSaveOnEveryRank) {
  // The sizes of one checkpoint's files, from a save to an ordinary folder.
  const std::string probe = MakeTempDir();
  testing::RunRanks(2, [&](Communicator& comm, int) {
    ASSERT_OK_AND_ASSIGN(auto e, MakeOneUnitEngine(comm));
    ASSERT_OK(e->Save(probe, {.tag = "first"}).status());
  });
  int64_t pages = 0, smallest = INT64_MAX;
  for (const auto& f : std::filesystem::recursive_directory_iterator(probe)) {
    if (!f.is_regular_file()) continue;
    pages += (static_cast<int64_t>(f.file_size()) + 4095) / 4096;
    if (f.path().filename().string().rfind("rank-", 0) == 0) {
      smallest = std::min<int64_t>(smallest, static_cast<int64_t>(f.file_size()));
    }
  }
  constexpr int64_t kSlack = 128 << 10;
  ASSERT_GT(smallest, 2 * kSlack) << "the test needs each rank file to be larger than the free space left";

  const std::string dir = MakeTempDir();
  const std::string options = absl::StrCat("size=", pages * 4096 + kSlack, ",mode=0700");
  if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, options.c_str()) != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs on " << dir << " (" << std::strerror(errno) << "; needs CAP_SYS_ADMIN)";
  }
  struct Unmount {
    std::string dir;
    ~Unmount() { ::umount2(dir.c_str(), MNT_DETACH); }
  } unmount{dir};

  testing::RunRanks(2, [&](Communicator& comm, int) {
    ASSERT_OK_AND_ASSIGN(auto e, MakeOneUnitEngine(comm));
    ASSERT_OK(e->Save(dir, {.tag = "first", .async = true}).status());
    ASSERT_OK(e->WaitForSave());
    ASSERT_OK(e->Save(dir, {.tag = "second", .async = true}).status());
    const Status s = e->WaitForSave();
    EXPECT_FALSE(s.ok());
    EXPECT_NE(std::string(s.message()).find("failed on rank "), std::string::npos) << s;
    EXPECT_NE(std::string(s.message()).find("No space left on device"), std::string::npos) << s;
    EXPECT_NE(std::string(s.message()).find(dir + "/second"), std::string::npos) << s;
  });
  ASSERT_OK_AND_ASSIGN(std::string latest, LatestCheckpointTag(dir));
  EXPECT_EQ(latest, "first");
  ASSERT_OK(VerifyCheckpoint(dir));
  ASSERT_OK_AND_ASSIGN(auto unlisted, UnlistedCheckpointFiles(dir, "first"));
  EXPECT_TRUE(unlisted.empty());
  EXPECT_FALSE(VerifyCheckpoint(dir, "second").ok());
  // Nothing of the failed save holds space: neither rank file nor a temporary one.
  if (std::filesystem::exists(dir + "/second")) {
    for (const auto& f : std::filesystem::directory_iterator(dir + "/second")) {
      EXPECT_EQ(f.path().filename().string().rfind("rank-", 0), std::string::npos) << "left behind: " << f.path();
    }
  }
  // And the checkpoint `latest` names loads on both ranks.
  testing::RunRanks(2, [&](Communicator& comm, int) {
    ASSERT_OK_AND_ASSIGN(auto e, MakeOneUnitEngine(comm));
    ASSERT_OK(e->Load(dir).status());
  });
}

// The estimator counts the asynchronous save's staging (EstimateOptions::async_save): what the engine's host
// kStaging and host peak_total grow by when its first asynchronous save allocates the staging, to the byte, at
// stage 2 in bf16 with stochastic rounding (the 16-bit parameters saved too) and at stage 3 with offload.
TEST(AsyncSaveBehaviourTest, TheEstimateCountsTheStaging) {
  for (const Case& c :
       {Case{"s2_bf16_sr", 2, 2, DType::kBF16, 1, false, true}, Case{"s3_f32_offload", 3, 3, DType::kF32, 1, true}}) {
    SCOPED_TRACE(c.name);
    const Config cfg = CaseConfig(c);
    const std::string dir = MakeTempDir();
    std::vector<EstimateUnit> units;
    for (const auto& [name, specs] : testing::SyntheticUnits()) {
      int64_t n = 0;
      for (const ParamSpec& s : specs) n += s.numel();
      units.push_back({name, n});
    }
    testing::RunRanks(c.world, [&](Communicator& comm, int rank) {
      ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, Borrow(comm)));
      SyntheticTrace t;
      ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, 2, 1, testing::HostViewIo(), &t));
      const MemoryReport before = e->memory_report();
      ASSERT_OK(e->Save(dir, {.async = true}).status());
      ASSERT_OK(e->WaitForSave());
      const MemoryReport after = e->memory_report();
      EstimateOptions eo;
      eo.world = c.world;
      eo.rank = rank;
      ASSERT_OK_AND_ASSIGN(RankEstimate without, Estimate(cfg, units, eo));
      eo.async_save = true;
      ASSERT_OK_AND_ASSIGN(RankEstimate with, Estimate(cfg, units, eo));
      const int64_t predicted = with.memory.Get(MemTier::kHost, MemTag::kStaging).current -
                                without.memory.Get(MemTier::kHost, MemTag::kStaging).current;
      EXPECT_GT(predicted, 0);
      EXPECT_EQ(after.Get(MemTier::kHost, MemTag::kStaging).current -
                    before.Get(MemTier::kHost, MemTag::kStaging).current,
                predicted);
      EXPECT_EQ(with.memory.peak_total[static_cast<size_t>(MemTier::kHost)] -
                    without.memory.peak_total[static_cast<size_t>(MemTier::kHost)],
                predicted);
    });
  }
}

// ShardedOptimizer saves asynchronously too: the same files as its synchronous save.
TEST(AsyncSaveBehaviourTest, ShardedOptimizerSavesAsynchronously) {
  const std::string sync_dir = MakeTempDir(), async_dir = MakeTempDir();
  constexpr int64_t kN = 5000;
  testing::RunRanks(2, [&](Communicator& comm, int) {
    for (const bool async : {false, true}) {
      const int64_t cap = ShardedOptimizer::Capacity(kN, 2);
      std::vector<float> params(cap), grads(cap);
      for (int64_t i = 0; i < kN; ++i) params[i] = 0.01f * static_cast<float>(i % 101);
      FlatBuffers flat;
      flat.params = params.data();
      flat.grads = grads.data();
      flat.capacity = cap;
      flat.tensors = {{"v", {kN}}};
      ASSERT_OK_AND_ASSIGN(auto opt, ShardedOptimizer::Create(TrainConfig(1, 1), Borrow(comm), {flat}));
      for (int k = 0; k < 2; ++k) {
        for (int64_t i = 0; i < kN; ++i) grads[i] = 0.1f * params[i] - 0.01f * static_cast<float>(k);
        ASSERT_OK(opt->Step().status());
      }
      ASSERT_OK(opt->Save(async ? async_dir : sync_dir, {.async = async}).status());
      EXPECT_EQ(opt->save_in_flight(), async);
      ASSERT_OK(opt->WaitForSave());
    }
  });
  for (const char* f : {"meta.json", "rank-00000-of-00002.bin", "rank-00001-of-00002.bin"}) {
    const std::string p = std::string("/step-00000002/") + f;
    EXPECT_TRUE(ReadWholeFile(sync_dir + p) == ReadWholeFile(async_dir + p)) << f;
  }
}

}  // namespace
}  // namespace zero
