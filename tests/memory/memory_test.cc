// The memory layer (zero/memory.h): MemoryTracker's per-(tier, tag) counters and peaks, Buffer's ownership and
// tracking, and MemoryReport's totals and renderings. Every memory figure zero reports comes from these, so the
// engine's memory-formula tests are only as good as this bookkeeping.
#include "zero/memory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/status_matchers.h"
#include "zero/features.h"
#include "zero/status.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::zero::testing::IsOk;
using ::zero::testing::StatusIs;

constexpr MemTag kAllTags[] = {MemTag::kParams, MemTag::kGrads,   MemTag::kOptimizer,   MemTag::kMaster,
                               MemTag::kGather, MemTag::kBuckets, MemTag::kActivations, MemTag::kStaging};

// ---- names ----

TEST(MemoryNamesTest, TagsAndTiersHaveTheirReportNames) {
  std::vector<std::string> names;
  for (MemTag tag : kAllTags) names.emplace_back(MemTagName(tag));
  EXPECT_THAT(names, ::testing::ElementsAre("params", "grads", "optimizer", "master", "gather", "buckets",
                                            "activations", "staging"));
  EXPECT_STREQ(MemTierName(MemTier::kHost), "host");
  EXPECT_STREQ(MemTierName(MemTier::kDevice), "device");
}

// ---- MemoryTracker ----

TEST(MemoryTrackerTest, CountsPerTierAndTag) {
  MemoryTracker t;
  t.Add(MemTier::kHost, MemTag::kParams, 100);
  t.Add(MemTier::kHost, MemTag::kParams, 20);
  t.Add(MemTier::kDevice, MemTag::kParams, 7);
  t.Add(MemTier::kHost, MemTag::kGrads, 5);
  t.Sub(MemTier::kHost, MemTag::kParams, 20);

  MemoryReport r = t.Report();
  EXPECT_EQ(r.Get(MemTier::kHost, MemTag::kParams).current, 100);
  EXPECT_EQ(r.Get(MemTier::kDevice, MemTag::kParams).current, 7);
  EXPECT_EQ(r.Get(MemTier::kHost, MemTag::kGrads).current, 5);
  // Nothing leaks into the other cells.
  for (MemTier tier : {MemTier::kHost, MemTier::kDevice}) {
    for (MemTag tag : kAllTags) {
      if (tag == MemTag::kParams || (tag == MemTag::kGrads && tier == MemTier::kHost)) continue;
      EXPECT_EQ(r.Get(tier, tag).current, 0) << MemTierName(tier) << " " << MemTagName(tag);
      EXPECT_EQ(r.Get(tier, tag).peak, 0) << MemTierName(tier) << " " << MemTagName(tag);
    }
  }
}

TEST(MemoryTrackerTest, PeakIsTheHighWaterMarkUntilReset) {
  MemoryTracker t;
  t.Add(MemTier::kHost, MemTag::kGather, 300);
  t.Add(MemTier::kHost, MemTag::kGather, 200);
  t.Sub(MemTier::kHost, MemTag::kGather, 400);
  t.Add(MemTier::kHost, MemTag::kGather, 50);
  EXPECT_EQ(t.Report().Get(MemTier::kHost, MemTag::kGather).current, 150);
  EXPECT_EQ(t.Report().Get(MemTier::kHost, MemTag::kGather).peak, 500);

  // ResetPeaks lowers every peak to the current figure, in both tiers; later growth raises it again.
  t.Add(MemTier::kDevice, MemTag::kBuckets, 64);
  t.Sub(MemTier::kDevice, MemTag::kBuckets, 64);
  t.ResetPeaks();
  MemoryReport r = t.Report();
  EXPECT_EQ(r.Get(MemTier::kHost, MemTag::kGather).peak, 150);
  EXPECT_EQ(r.Get(MemTier::kDevice, MemTag::kBuckets).peak, 0);
  t.Add(MemTier::kHost, MemTag::kGather, 10);
  EXPECT_EQ(t.Report().Get(MemTier::kHost, MemTag::kGather).peak, 160);
}

TEST(MemoryTrackerTest, AllocationsCountAddsPerTier) {
  MemoryTracker t;
  EXPECT_EQ(t.allocations(MemTier::kHost), 0);
  t.Add(MemTier::kHost, MemTag::kParams, 8);
  t.Add(MemTier::kHost, MemTag::kStaging, 8);
  t.Add(MemTier::kDevice, MemTag::kParams, 8);
  // Frees and peak resets are not allocations: the count is what the engine's steady-state checks compare.
  t.Sub(MemTier::kHost, MemTag::kParams, 8);
  t.ResetPeaks();
  EXPECT_EQ(t.allocations(MemTier::kHost), 2);
  EXPECT_EQ(t.allocations(MemTier::kDevice), 1);
}

TEST(MemoryTrackerTest, PaddingAccumulatesIntoTheReport) {
  MemoryTracker t;
  EXPECT_EQ(t.Report().padding_bytes, 0);
  t.AddPadding(96);
  t.AddPadding(32);
  EXPECT_EQ(t.Report().padding_bytes, 128);
  // Padding is a note about the figures, not a tagged allocation of its own.
  EXPECT_EQ(t.Report().Current(MemTier::kHost), 0);
  EXPECT_EQ(t.allocations(MemTier::kHost), 0);
}

// The counters are atomic: ranks' threads and the copy-stream worker allocate and free concurrently.
TEST(MemoryTrackerTest, ConcurrentAddsAndSubsBalance) {
  MemoryTracker t;
  constexpr int kThreads = 4;
  constexpr int kRounds = 10000;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&t] {
      for (int k = 0; k < kRounds; ++k) {
        t.Add(MemTier::kHost, MemTag::kStaging, 16);
        t.Sub(MemTier::kHost, MemTag::kStaging, 16);
      }
    });
  }
  for (auto& th : threads) th.join();
  const MemoryUsage u = t.Report().Get(MemTier::kHost, MemTag::kStaging);
  EXPECT_EQ(u.current, 0);
  EXPECT_GE(u.peak, 16);
  EXPECT_LE(u.peak, 16 * kThreads);
  EXPECT_EQ(t.allocations(MemTier::kHost), kThreads * kRounds);
}

// What decides an out-of-memory error is the most bytes alive at once in a tier, not the sum of each tag's own
// high-water mark: tags peak at different moments (a stage-3 gather is released before the buckets fill).
TEST(MemoryTrackerTest, PeakTotalIsTheHighWaterMarkOfTheSumNotTheSumOfPeaks) {
  MemoryTracker t;
  t.Add(MemTier::kDevice, MemTag::kParams, 10);
  t.Add(MemTier::kDevice, MemTag::kGather, 100);  // 110 alive
  t.Sub(MemTier::kDevice, MemTag::kGather, 100);
  t.Add(MemTier::kDevice, MemTag::kBuckets, 80);  // 90 alive
  t.Add(MemTier::kDevice, MemTag::kGather, 30);   // 120 alive: the peak
  t.Sub(MemTier::kDevice, MemTag::kBuckets, 80);
  t.Add(MemTier::kHost, MemTag::kStaging, 7);  // the other tier has its own total
  MemoryReport r = t.Report();
  EXPECT_EQ(r.Get(MemTier::kDevice, MemTag::kGather).peak, 100);
  EXPECT_EQ(r.Get(MemTier::kDevice, MemTag::kBuckets).peak, 80);
  EXPECT_EQ(r.PeakTotal(MemTier::kDevice), 120);  // not 10 + 100 + 80 = 190
  EXPECT_EQ(r.PeakTotal(MemTier::kHost), 7);
  EXPECT_EQ(r.Current(MemTier::kDevice), 40);
}

TEST(MemoryTrackerTest, ResetPeaksLowersPeakTotalToTheCurrentTotal) {
  MemoryTracker t;
  t.Add(MemTier::kHost, MemTag::kGrads, 64);
  t.Add(MemTier::kHost, MemTag::kBuckets, 36);
  t.Sub(MemTier::kHost, MemTag::kBuckets, 36);
  t.Add(MemTier::kDevice, MemTag::kParams, 5);
  t.Sub(MemTier::kDevice, MemTag::kParams, 5);
  EXPECT_EQ(t.Report().PeakTotal(MemTier::kHost), 100);
  t.ResetPeaks();
  EXPECT_EQ(t.Report().PeakTotal(MemTier::kHost), 64);
  EXPECT_EQ(t.Report().PeakTotal(MemTier::kDevice), 0);
  t.Add(MemTier::kHost, MemTag::kBuckets, 10);
  EXPECT_EQ(t.Report().PeakTotal(MemTier::kHost), 74);
}

// Every thread holds its bytes until all have added, so each round's true peak is exactly the sum of what the
// threads hold; a raise of the peak lost to a concurrent one would show as a smaller peak_total.
TEST(MemoryTrackerTest, ConcurrentAddsNeverLoseThePeakTotal) {
  MemoryTracker t;
  constexpr int kThreads = 8;
  constexpr int kRounds = 300;
  constexpr int64_t kHeld = (1 + kThreads) * kThreads / 2 * 1000;  // thread i holds (i + 1) * 1000 bytes
  std::atomic<int> wrong{0};
  std::barrier all_added(kThreads, [&]() noexcept {
    const MemoryReport r = t.Report();
    if (r.PeakTotal(MemTier::kHost) != kHeld || r.Current(MemTier::kHost) != kHeld) wrong.fetch_add(1);
  });
  std::barrier all_freed(kThreads, [&]() noexcept { t.ResetPeaks(); });
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      const MemTag tag = kAllTags[i % 8];
      for (int k = 0; k < kRounds; ++k) {
        // Small allocations first, so the threads' CAS loops on the total's peak race one another.
        for (int j = 0; j < i + 1; ++j) t.Add(MemTier::kHost, tag, 1000);
        all_added.arrive_and_wait();
        t.Sub(MemTier::kHost, tag, (i + 1) * 1000);
        all_freed.arrive_and_wait();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0) << "rounds whose peak_total was not the " << kHeld << " bytes alive at once";
  EXPECT_EQ(t.Report().PeakTotal(MemTier::kHost), 0);
}

// An engine counts its communicator's tracker into its own: its peak_total then covers both trackers' bytes
// alive at once, while each tracker's per-tag figures stay its own.
TEST(MemoryTrackerTest, CountAlsoInJoinsAnotherTrackersBytesToThePeakTotal) {
  MemoryTracker engine, comm;
  comm.Add(MemTier::kHost, MemTag::kStaging, 50);  // alive before the link: handed over when it starts
  engine.Add(MemTier::kHost, MemTag::kOptimizer, 200);
  comm.CountAlsoIn(&engine);
  EXPECT_EQ(engine.Report().PeakTotal(MemTier::kHost), 250);
  comm.Add(MemTier::kHost, MemTag::kStaging, 30);
  comm.Sub(MemTier::kHost, MemTag::kStaging, 80);
  engine.Add(MemTier::kHost, MemTag::kGather, 60);  // 260 alive at once: more than either peak alone explains
  engine.Sub(MemTier::kHost, MemTag::kGather, 60);
  comm.Add(MemTier::kDevice, MemTag::kStaging, 9);
  MemoryReport e = engine.Report();
  EXPECT_EQ(e.PeakTotal(MemTier::kHost), 280);  // 200 + 80, then 200 + 60
  EXPECT_EQ(e.PeakTotal(MemTier::kDevice), 9);
  EXPECT_EQ(e.Get(MemTier::kHost, MemTag::kStaging).peak, 0);  // per-tag figures stay the tracker's own
  EXPECT_EQ(comm.Report().PeakTotal(MemTier::kHost), 80);      // the linked tracker's own total is unchanged
  EXPECT_EQ(comm.allocations(MemTier::kHost), 2);
  EXPECT_EQ(engine.allocations(MemTier::kHost), 2);

  // Linking twice counts once; after the link ends the engine's total is its own again.
  comm.CountAlsoIn(&engine);
  comm.StopCountingIn(&engine);
  comm.StopCountingIn(&engine);  // no link: nothing to take out
  engine.ResetPeaks();
  EXPECT_EQ(engine.Report().PeakTotal(MemTier::kHost), 200);
  EXPECT_EQ(engine.Report().PeakTotal(MemTier::kDevice), 0);
  comm.Add(MemTier::kHost, MemTag::kStaging, 1000);
  EXPECT_EQ(engine.Report().PeakTotal(MemTier::kHost), 200);
}

// ReportWithLinked counts the linked tracker's bytes into each tag as they come and go: a tag's peak is the
// high-water mark of its bytes in both trackers alive at once, never above the tier's peak_total. Adding the two
// trackers' separate peaks (what Engine::memory_report did) gave a staging peak of 80 + 40 = 120 here, above the
// peak_total of 100: the engine's piece of a Load was freed before the communicator's cache filled.
TEST(MemoryTrackerTest, ReportWithLinkedKeepsEveryTagPeakWithinThePeakTotal) {
  MemoryTracker engine, comm;
  comm.Add(MemTier::kHost, MemTag::kStaging, 500);  // a peak from before the link (another engine's run)
  comm.Sub(MemTier::kHost, MemTag::kStaging, 500);
  comm.CountAlsoIn(&engine);
  engine.Add(MemTier::kHost, MemTag::kStaging, 40);  // Load's piece
  engine.Sub(MemTier::kHost, MemTag::kStaging, 40);
  comm.Add(MemTier::kHost, MemTag::kStaging, 80);  // the communicator's cache
  engine.Add(MemTier::kHost, MemTag::kGrads, 20);
  const MemoryReport r = engine.ReportWithLinked();
  EXPECT_EQ(r.PeakTotal(MemTier::kHost), 100);
  EXPECT_EQ(r.Get(MemTier::kHost, MemTag::kStaging).peak, 80);
  EXPECT_EQ(r.Get(MemTier::kHost, MemTag::kStaging).current, 80);
  EXPECT_EQ(r.Get(MemTier::kHost, MemTag::kGrads).peak, 20);
  EXPECT_EQ(engine.Report().Get(MemTier::kHost, MemTag::kStaging).peak, 40);  // Report: its own bytes only
  comm.StopCountingIn(&engine);
  EXPECT_EQ(engine.ReportWithLinked().Get(MemTier::kHost, MemTag::kStaging).current, 0);
  engine.ResetPeaks();
  EXPECT_EQ(engine.ReportWithLinked().Get(MemTier::kHost, MemTag::kStaging).peak, 0);
}

// Threads allocate and free under several tags of a linked tracker and of the tracker itself at once: whatever
// the interleaving, no tag's peak exceeds the tier's peak_total (an allocation enters the total before its tag
// and a free leaves its tag first).
TEST(MemoryTrackerTest, ConcurrentTagPeaksNeverExceedThePeakTotal) {
  MemoryTracker engine, comm;
  comm.CountAlsoIn(&engine);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      MemoryTracker& t = i % 2 == 0 ? engine : comm;
      const MemTag tag = i < 2 ? MemTag::kStaging : MemTag::kBuckets;
      for (int k = 0; k < 20000; ++k) {
        const int64_t bytes = 1 + (k * 7 + i) % 97;
        t.Add(MemTier::kHost, tag, bytes);
        t.Sub(MemTier::kHost, tag, bytes);
      }
    });
  }
  for (auto& th : threads) th.join();
  const MemoryReport r = engine.ReportWithLinked();
  for (MemTag tag : kAllTags) EXPECT_LE(r.Get(MemTier::kHost, tag).peak, r.PeakTotal(MemTier::kHost));
  EXPECT_EQ(r.Current(MemTier::kHost), 0);
  comm.StopCountingIn(&engine);
}

// Links start and end while another thread allocates in the linked tracker: each allocation is counted in the
// engine's total entirely or not at all, so once everything is freed the engine's total is exactly zero.
TEST(MemoryTrackerTest, LinkingWhileAnotherThreadAllocatesCountsEveryByteOnce) {
  MemoryTracker engine, comm;
  std::atomic<bool> done{false};
  std::thread worker([&] {
    int64_t held = 0;
    for (int k = 0; k < 20000; ++k) {
      comm.Add(MemTier::kHost, MemTag::kStaging, 24);
      held += 24;
      if (k % 3 == 2) {
        comm.Sub(MemTier::kHost, MemTag::kStaging, held);
        held = 0;
      }
    }
    comm.Sub(MemTier::kHost, MemTag::kStaging, held);
    done = true;
  });
  engine.Add(MemTier::kHost, MemTag::kParams, 8);
  bool linked = false;
  while (!done.load()) {
    if (linked) {
      comm.StopCountingIn(&engine);
    } else {
      comm.CountAlsoIn(&engine);
    }
    linked = !linked;
  }
  worker.join();
  if (linked) comm.StopCountingIn(&engine);
  engine.ResetPeaks();
  EXPECT_EQ(engine.Report().PeakTotal(MemTier::kHost), 8);
  engine.Sub(MemTier::kHost, MemTag::kParams, 8);
  engine.ResetPeaks();
  EXPECT_EQ(engine.Report().PeakTotal(MemTier::kHost), 0);
}

// ---- Buffer ----

bool AllZero(const Buffer& b) {
  for (size_t i = 0; i < b.size(); ++i) {
    if (b.as<unsigned char>()[i] != 0) return false;
  }
  return true;
}

TEST(BufferTest, HostIsAlignedZeroFilledAndTracked) {
  MemoryTracker t;
  {
    Buffer b = Buffer::Host(&t, MemTag::kMaster, 1000);
    ASSERT_FALSE(b.empty());
    EXPECT_EQ(b.size(), 1000u);
    EXPECT_EQ(b.tag(), MemTag::kMaster);
    EXPECT_EQ(b.tier(), MemTier::kHost);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
    EXPECT_TRUE(AllZero(b));
    // The tracker counts the requested bytes, not the 64-byte rounded allocation.
    EXPECT_EQ(t.Report().Get(MemTier::kHost, MemTag::kMaster).current, 1000);
    EXPECT_EQ(t.allocations(MemTier::kHost), 1);
  }
  // Destruction frees and untracks; the peak remembers it.
  EXPECT_EQ(t.Report().Get(MemTier::kHost, MemTag::kMaster).current, 0);
  EXPECT_EQ(t.Report().Get(MemTier::kHost, MemTag::kMaster).peak, 1000);
}

TEST(BufferTest, HostInTheDeviceTierIsReportedThere) {
  // The host engine's compute tier is host DRAM reported as "device".
  MemoryTracker t;
  Buffer b = Buffer::Host(&t, MemTag::kParams, 256, MemTier::kDevice);
  EXPECT_EQ(b.tier(), MemTier::kDevice);
  EXPECT_EQ(t.Report().Get(MemTier::kDevice, MemTag::kParams).current, 256);
  EXPECT_EQ(t.Report().Get(MemTier::kHost, MemTag::kParams).current, 0);
  b.Reset();
  EXPECT_EQ(t.Report().Get(MemTier::kDevice, MemTag::kParams).current, 0);
}

TEST(BufferTest, ZeroBytesIsEmptyAndUntracked) {
  MemoryTracker t;
  Buffer b = Buffer::Host(&t, MemTag::kParams, 0);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.size(), 0u);
  EXPECT_EQ(t.allocations(MemTier::kHost), 0);
  Buffer d;
  EXPECT_TRUE(d.empty());
  d.Reset();  // resetting an empty buffer is a no-op
  EXPECT_TRUE(d.empty());
}

TEST(BufferTest, WithoutATrackerNothingIsCounted) {
  Buffer b = Buffer::Host(nullptr, MemTag::kParams, 128);
  ASSERT_FALSE(b.empty());
  EXPECT_TRUE(AllZero(b));
  b.Reset();
  EXPECT_TRUE(b.empty());
}

TEST(BufferTest, ResetFreesUntracksAndEmpties) {
  MemoryTracker t;
  Buffer b = Buffer::Host(&t, MemTag::kBuckets, 512);
  b.Reset();
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.size(), 0u);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(t.Report().Get(MemTier::kHost, MemTag::kBuckets).current, 0);
  b.Reset();  // twice: nothing is subtracted again
  EXPECT_EQ(t.Report().Get(MemTier::kHost, MemTag::kBuckets).current, 0);
}

TEST(BufferTest, MoveTransfersOwnershipAndEmptiesTheSource) {
  MemoryTracker t;
  Buffer a = Buffer::Host(&t, MemTag::kGrads, 64, MemTier::kDevice);
  void* p = a.data();
  a.as<float>()[3] = 2.5f;

  Buffer b(std::move(a));
  EXPECT_TRUE(a.empty());   // NOLINT(bugprone-use-after-move): the moved-from state is what is tested
  EXPECT_EQ(a.size(), 0u);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.size(), 64u);
  EXPECT_EQ(b.tag(), MemTag::kGrads);
  EXPECT_EQ(b.tier(), MemTier::kDevice);
  EXPECT_EQ(b.as<float>()[3], 2.5f);
  // A move is not a new allocation, and the bytes are counted once.
  EXPECT_EQ(t.Report().Get(MemTier::kDevice, MemTag::kGrads).current, 64);
  EXPECT_EQ(t.allocations(MemTier::kDevice), 1);

  // Resetting the moved-from buffer untracks nothing; the new owner untracks once.
  a.Reset();  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(t.Report().Get(MemTier::kDevice, MemTag::kGrads).current, 64);
  b.Reset();
  EXPECT_EQ(t.Report().Get(MemTier::kDevice, MemTag::kGrads).current, 0);
}

TEST(BufferTest, MoveAssignmentFreesWhatTheTargetHeld) {
  MemoryTracker t;
  Buffer target = Buffer::Host(&t, MemTag::kParams, 100);
  Buffer source = Buffer::Host(&t, MemTag::kOptimizer, 40);
  target = std::move(source);
  EXPECT_TRUE(source.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(target.tag(), MemTag::kOptimizer);
  EXPECT_EQ(target.size(), 40u);
  MemoryReport r = t.Report();
  EXPECT_EQ(r.Get(MemTier::kHost, MemTag::kParams).current, 0);
  EXPECT_EQ(r.Get(MemTier::kHost, MemTag::kOptimizer).current, 40);
  target = Buffer();
  EXPECT_TRUE(target.empty());
  EXPECT_EQ(t.Report().Current(MemTier::kHost), 0);
}

TEST(BufferTest, PinnedIsZeroFilledAndTrackedInTheHostTier) {
  // Page-locked when a CUDA device is present, plain host memory otherwise: the bookkeeping is the same.
  MemoryTracker t;
  {
    Buffer b = Buffer::Pinned(&t, MemTag::kStaging, 4096);
    ASSERT_FALSE(b.empty());
    EXPECT_EQ(b.size(), 4096u);
    EXPECT_EQ(b.tier(), MemTier::kHost);
    EXPECT_TRUE(AllZero(b));
    EXPECT_EQ(t.Report().Get(MemTier::kHost, MemTag::kStaging).current, 4096);

    Buffer moved = std::move(b);
    EXPECT_TRUE(b.empty());  // NOLINT(bugprone-use-after-move)
    EXPECT_EQ(t.Report().Get(MemTier::kHost, MemTag::kStaging).current, 4096);
  }
  EXPECT_EQ(t.Report().Get(MemTier::kHost, MemTag::kStaging).current, 0);
  EXPECT_TRUE(Buffer::Pinned(&t, MemTag::kStaging, 0).empty());
}

TEST(BufferTest, DeviceIsTrackedOrFailsNamingTagAndSize) {
  // Which branch runs depends on the machine (a CUDA build with a device, or not); both are the contract.
  MemoryTracker t;
  Status error;
  {
    Buffer b = Buffer::Device(&t, MemTag::kGather, 1 << 20, &error);
    if (error.ok()) {
      ASSERT_FALSE(b.empty());
      EXPECT_EQ(b.tier(), MemTier::kDevice);
      EXPECT_EQ(t.Report().Get(MemTier::kDevice, MemTag::kGather).current, 1 << 20);
    } else {
      EXPECT_TRUE(b.empty());
      EXPECT_THAT(error,
                  StatusIs(ZERO_HAVE_CUDA ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kUnimplemented,
                           ::testing::AllOf(HasSubstr("1048576 bytes"), HasSubstr("gather"))));
      EXPECT_EQ(t.allocations(MemTier::kDevice), 0);
    }
  }
  EXPECT_EQ(t.Report().Get(MemTier::kDevice, MemTag::kGather).current, 0);
  // Zero bytes: empty and no error, on every machine.
  Status untouched;
  EXPECT_TRUE(Buffer::Device(&t, MemTag::kGather, 0, &untouched).empty());
  EXPECT_THAT(untouched, IsOk());
}

// ---- MemoryReport ----

TEST(MemoryReportTest, TotalsPerTierAndModelState) {
  MemoryTracker t;
  t.Add(MemTier::kHost, MemTag::kParams, 1);
  t.Add(MemTier::kHost, MemTag::kGrads, 10);
  t.Add(MemTier::kHost, MemTag::kOptimizer, 100);
  t.Add(MemTier::kHost, MemTag::kMaster, 1000);
  t.Add(MemTier::kHost, MemTag::kStaging, 10000);
  t.Add(MemTier::kDevice, MemTag::kParams, 100000);
  t.Add(MemTier::kDevice, MemTag::kGather, 1000000);
  t.Add(MemTier::kDevice, MemTag::kBuckets, 10000000);
  t.Add(MemTier::kDevice, MemTag::kActivations, 100000000);
  MemoryReport r = t.Report();
  EXPECT_EQ(r.Current(MemTier::kHost), 11111);
  EXPECT_EQ(r.Current(MemTier::kDevice), 111100000);
  // Model state is params + grads + optimizer + master in both tiers: not gather, buckets, activations, staging.
  EXPECT_EQ(r.ModelStateBytes(), 101111);
}

TEST(MemoryReportTest, JsonNamesTheDevicePartOfATagUsedInBothTiers) {
  MemoryTracker t;
  EXPECT_EQ(t.Report().ToJson(), "{\"peak_total\": {\"host\": 0, \"device\": 0}}");
  t.Add(MemTier::kHost, MemTag::kParams, 100);
  t.Add(MemTier::kDevice, MemTag::kParams, 50);
  t.Add(MemTier::kDevice, MemTag::kGrads, 30);  // device only: plain "grads", its tier says where
  t.Add(MemTier::kHost, MemTag::kStaging, 8);
  t.Sub(MemTier::kHost, MemTag::kStaging, 8);  // used once: still listed, with current 0
  EXPECT_EQ(t.Report().ToJson(),
            "{\"params\": {\"tier\": \"host\", \"current\": 100, \"peak\": 100}, "
            "\"params@device\": {\"tier\": \"device\", \"current\": 50, \"peak\": 50}, "
            "\"grads\": {\"tier\": \"device\", \"current\": 30, \"peak\": 30}, "
            "\"staging\": {\"tier\": \"host\", \"current\": 0, \"peak\": 8}, "
            "\"peak_total\": {\"host\": 108, \"device\": 80}}");
}

TEST(MemoryReportTest, StringListsUsedCellsAndPadding) {
  MemoryTracker t;
  t.Add(MemTier::kHost, MemTag::kOptimizer, 4096);
  t.Add(MemTier::kDevice, MemTag::kActivations, 123);
  t.Sub(MemTier::kDevice, MemTag::kActivations, 23);
  t.AddPadding(64);
  const std::string s = t.Report().ToString();
  EXPECT_THAT(s, HasSubstr("current_bytes"));
  EXPECT_THAT(s, HasSubstr("peak_bytes"));
  EXPECT_THAT(s, ::testing::ContainsRegex("host +optimizer +4096 +4096\n"));
  EXPECT_THAT(s, ::testing::ContainsRegex("device +activations +100 +123\n"));
  EXPECT_THAT(s, HasSubstr("peak total (all tags alive at once): host 4096 device 123\n"));
  EXPECT_THAT(s, HasSubstr("padding bytes (included above): 64\n"));
  // Cells never used are left out.
  EXPECT_THAT(s, Not(HasSubstr("params")));
  EXPECT_THAT(s, Not(HasSubstr("gather")));
}

}  // namespace
}  // namespace zero
