// A unit larger than allgather_bucket_size / reduce_bucket_size is gathered and reduce-scattered in chunks of at
// most that many elements, each rank keeping its contiguous shard (shard/internal/collective.h). Chunks move data
// and reduce each element over the same ranks with the same Gloo algorithm, whose summation tree for an element
// does not depend on where the element lies in the buffer, so the chunked run must equal the unchunked one bit
// for bit — step results and every final parameter — and a chunked run repeated gives the same bits again. The
// synthetic trainer's units have odd sizes (37x19 + 19, 19x23, 101, 64x33), so the chunks of 200-element buckets
// end short at every world size 2-5; the cases cover stages 1-3, fp32/bf16, micro-step accumulation in both
// modes, offload and a persistent stage-3 unit (refreshed in chunks by the step).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "shard/internal/collective.h"
#include "shard/internal/context.h"
#include "support/engine_helpers.h"
#include "support/forwarding_comm.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "support/synthetic_trainer.h"
#include "zero/advanced/communicator_ext.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/engine.h"

namespace zero {
namespace {

using testing::Borrow;
using testing::SyntheticTrace;
using testing::TrainConfig;

struct Case {
  const char* name;
  int world;
  int stage;
  DType dtype = DType::kF32;
  int ga = 1;
  GradAccumulationMode mode = GradAccumulationMode::kLowMemory;
  bool offload = false;
  int64_t persistence = 0;  // stage3_param_persistence_threshold
};

Config CaseConfig(const Case& c, int64_t bucket) {
  Config cfg = TrainConfig(c.stage, /*micro=*/1, c.ga, 3e-3, 1.0, c.mode);
  cfg.bf16.enabled = c.dtype == DType::kBF16;
  cfg.zero.stage3_param_persistence_threshold = c.persistence;
  if (c.offload) {
    cfg.zero.offload_optimizer.device = OffloadDevice::kCpu;
    if (c.stage == 3) cfg.zero.offload_param.device = OffloadDevice::kCpu;
  }
  if (bucket > 0) {
    cfg.zero.reduce_bucket_size = bucket;
    cfg.zero.allgather_bucket_size = bucket;
  }
  return cfg;
}

// Trains the synthetic model for `steps` and returns its trace and how many collectives the rank issued meanwhile
// (a barrier's sequence number before and after).
int64_t Train(const Config& cfg, Communicator& comm, int steps, int ga, SyntheticTrace* t) {
  const int64_t before = comm.Barrier().sequence();
  auto e = testing::MakeSyntheticEngine(cfg, Borrow(comm));
  EXPECT_OK(e);
  if (!e.ok()) return 0;
  testing::TrainSynthetic(**e, steps, ga, testing::HostViewIo(), t);
  return comm.Barrier().sequence() - before;
}

void ExpectSameBits(const SyntheticTrace& a, const SyntheticTrace& b, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t k = 0; k < a.steps.size(); ++k) {
    EXPECT_EQ(a.steps[k].grad_norm, b.steps[k].grad_norm) << "step " << k;
    EXPECT_EQ(a.steps[k].skipped, b.steps[k].skipped) << "step " << k;
  }
  ASSERT_EQ(a.params.size(), b.params.size());
  for (const auto& [name, av] : a.params) {
    const std::vector<float>& bv = b.params.at(name);
    ASSERT_EQ(av.size(), bv.size()) << name;
    for (size_t i = 0; i < av.size(); ++i) {
      ASSERT_EQ(std::memcmp(&av[i], &bv[i], 4), 0) << name << "[" << i << "]: " << av[i] << " vs " << bv[i];
    }
  }
}

class ChunkedCollectivesTest : public ::testing::TestWithParam<Case> {};

TEST_P(ChunkedCollectivesTest, BitwiseEqualToOneCollectivePerUnitAndRepeatable) {
  const Case& c = GetParam();
  constexpr int kSteps = 3;
  constexpr int64_t kBucket = 200;  // elements: every unit but "c" is chunked at every world size
  testing::RunRanks(c.world, [&](Communicator& comm, int) {
    SyntheticTrace whole, chunked, again;
    const int64_t ops_whole = Train(CaseConfig(c, 0), comm, kSteps, c.ga, &whole);
    const int64_t ops_chunked = Train(CaseConfig(c, kBucket), comm, kSteps, c.ga, &chunked);
    Train(CaseConfig(c, kBucket), comm, kSteps, c.ga, &again);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    // The chunks really ran: more, smaller collectives.
    EXPECT_GT(ops_chunked, ops_whole);
    ExpectSameBits(chunked, whole, "chunked vs one collective per unit");
    ExpectSameBits(again, chunked, "chunked, run twice");
    size_t moved = 0;
    for (const auto& [name, v] : whole.params) moved += testing::MovedElements(name, v);
    EXPECT_GT(moved, 0u);
  });
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, ChunkedCollectivesTest,
    ::testing::Values(Case{"w2_s1_f32", 2, 1}, Case{"w3_s1_bf16_ga2", 3, 1, DType::kBF16, 2},
                      Case{"w2_s2_f32_ga2", 2, 2, DType::kF32, 2}, Case{"w3_s2_bf16", 3, 2, DType::kBF16},
                      Case{"w4_s2_f32_ga2_lowcomm", 4, 2, DType::kF32, 2, GradAccumulationMode::kLowCommunication},
                      Case{"w5_s2_f32_offload", 5, 2, DType::kF32, 1, GradAccumulationMode::kLowMemory, true},
                      Case{"w4_s3_f32_ga2", 4, 3, DType::kF32, 2}, Case{"w5_s3_bf16", 5, 3, DType::kBF16},
                      Case{"w3_s3_f32_offload", 3, 3, DType::kF32, 1, GradAccumulationMode::kLowMemory, true},
                      Case{"w2_s3_f32_persistent", 2, 3, DType::kF32, 1, GradAccumulationMode::kLowMemory, false,
                           1000}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// ---------------------------------------------------------------------------------------------------------
// UnitCollective alone: the all-gather written in place by Communicator::AllGatherStrided (Gloo) and the
// reduce-scatter that reads the ranks' ranges where they lie (ReduceScatterStrided) against the staging paths
// (gather into a staging buffer and copy every rank's piece out; pack the ranges, then reduce-scatter), which a
// communicator without them gets. Bit for bit, at worlds 2-5, odd shard sizes, chunks that do not divide them,
// in place or not.

// Hides the strided collectives: UnitCollective then gathers and reduces through its staging buffers.
class StagingOnly final : public testing::ForwardingComm {
 public:
  using ForwardingComm::ForwardingComm;
  bool SupportsAllGatherStrided() const override { return false; }
  bool SupportsReduceScatterStrided(size_t, DType) const override { return false; }
};

// This rank's shard of S elements of `dtype`: any bits (NaN patterns included) must survive a gather.
std::vector<uint8_t> ShardBits(int rank, int64_t S, DType dtype) {
  std::vector<uint8_t> v(static_cast<size_t>(S) * DTypeSize(dtype));
  for (size_t j = 0; j < v.size(); ++j) v[j] = static_cast<uint8_t>((rank + 1) * 97 + j * 31 + (j >> 8));
  return v;
}

// One unit's chunked all-gather through UnitCollective over `comm`, as the engine issues and joins it; `full`
// starts with every byte 0xAB. In place: this rank's shard already sits at full + rank·S.
std::vector<uint8_t> GatherUnit(const std::shared_ptr<Communicator>& comm, int64_t S, int64_t chunk, DType dtype,
                                bool in_place) {
  internal::EngineContext ctx(Config::Default(), comm, nullptr, nullptr, EngineOptions{});
  ctx.compute = internal::MakeHostCompute(&ctx.tracker);
  internal::BufferPool pool(ctx.compute, MemTag::kStaging);
  const size_t es = DTypeSize(dtype);
  const int rank = comm->rank(), world = comm->world_size();
  const std::vector<uint8_t> shard = ShardBits(rank, S, dtype);
  std::vector<uint8_t> full(static_cast<size_t>(world * S) * es, 0xAB);
  const void* send = shard.data();
  if (in_place) {
    std::copy(shard.begin(), shard.end(), full.begin() + rank * S * static_cast<int64_t>(es));
    send = full.data() + rank * S * static_cast<int64_t>(es);
  }
  internal::UnitCollective c = internal::UnitCollective::AllGather(&ctx, &pool, send, full.data(), S, chunk, dtype);
  EXPECT_OK(c.Join());
  c.ReleaseStaging();
  return full;
}

TEST(UnitCollectiveTest, StridedAllGatherEqualsTheStagingPathBitForBit) {
  for (int world = 2; world <= 5; ++world) {
    testing::RunRanks(world, [world](Communicator& comm, int) {
      ASSERT_TRUE(advanced::Extended(comm)->SupportsAllGatherStrided());
      StagingOnly staged_comm(comm);
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        for (int64_t S : {int64_t{1}, int64_t{33}, int64_t{1001}}) {
          for (int64_t chunk : {int64_t{7}, int64_t{32}, int64_t{96}}) {
            for (bool in_place : {false, true}) {
              SCOPED_TRACE(absl::StrCat("world ", world, " dtype ", std::string(DTypeName(dtype)), " S ", S, " chunk ",
                                        chunk, in_place ? " in place" : ""));
              const int64_t before = comm.Barrier().sequence();
              const std::vector<uint8_t> strided = GatherUnit(Borrow(comm), S, chunk, dtype, in_place);
              // Only strided all-gathers ran, one per chunk.
              const int64_t chunks = (S + chunk - 1) / chunk;
              EXPECT_EQ(comm.Barrier().sequence() - before, chunks + 1);
              const std::vector<std::string> recent = comm.RecentOps();
              ASSERT_GE(recent.size(), 2u);
              EXPECT_THAT(recent[recent.size() - 2], ::testing::HasSubstr("AllGatherStrided#"));
              const std::vector<uint8_t> staged = GatherUnit(Borrow(staged_comm), S, chunk, dtype, in_place);
              EXPECT_THAT(comm.RecentOps().back(), ::testing::StartsWith("AllGather#"));
              ASSERT_EQ(strided, staged);
              const size_t es = DTypeSize(dtype);
              for (int r = 0; r < world; ++r) {
                const std::vector<uint8_t> want = ShardBits(r, S, dtype);
                ASSERT_TRUE(std::equal(want.begin(), want.end(), strided.begin() + r * S * static_cast<int64_t>(es)))
                    << "the shard of rank " << r;
              }
            }
          }
        }
      }
    });
  }
}

// One unit's chunked reduce-scatter (average) of f32 through UnitCollective over `comm`, as the engine issues and
// joins it. In place: the result overwrites this rank's block of the input, as the engine's stage-1 slice does.
// Returns this rank's block of the result; the input must come back unchanged except for that block.
std::vector<float> ReduceUnit(const std::shared_ptr<Communicator>& comm, int64_t S, int64_t chunk, bool in_place) {
  internal::EngineContext ctx(Config::Default(), comm, nullptr, nullptr, EngineOptions{});
  ctx.compute = internal::MakeHostCompute(&ctx.tracker);
  internal::BufferPool pool(ctx.compute, MemTag::kStaging);
  const int rank = comm->rank(), world = comm->world_size();
  std::vector<float> src(static_cast<size_t>(world * S));
  for (size_t i = 0; i < src.size(); ++i) src[i] = std::sin(0.11f * static_cast<float>(i + 7 * rank)) * 97.0f / 7.0f;
  const std::vector<float> input = src;
  std::vector<float> separate(static_cast<size_t>(S), -1.0f);
  float* recv = in_place ? src.data() + rank * S : separate.data();
  internal::UnitCollective c =
      internal::UnitCollective::ReduceScatter(&ctx, &pool, src.data(), DType::kF32, recv, DType::kF32, S, chunk);
  EXPECT_OK(c.Join());
  c.ReleaseStaging();
  for (int64_t i = 0; i < world * S; ++i) {
    if (in_place && i / S == rank) continue;
    EXPECT_EQ(src[i], input[i]) << "input element " << i << " was modified";
    if (src[i] != input[i]) break;
  }
  return std::vector<float>(recv, recv + S);
}

TEST(UnitCollectiveTest, StridedReduceScatterEqualsThePackingPathBitForBit) {
  for (int world = 2; world <= 5; ++world) {
    testing::RunRanks(world, [world](Communicator& comm, int) {
      StagingOnly staged_comm(comm);
      const bool power_of_two = (world & (world - 1)) == 0;
      // Chunks of 1024 and more per rank read in place (power-of-two worlds); a last chunk below 1024 is packed.
      for (int64_t S : {int64_t{1025}, int64_t{3089}, int64_t{4097}}) {
        for (int64_t chunk : {int64_t{1024}, int64_t{1056}, int64_t{2048}}) {
          for (bool in_place : {false, true}) {
            SCOPED_TRACE(absl::StrCat("world ", world, " S ", S, " chunk ", chunk, in_place ? " in place" : ""));
            const int64_t before = comm.Barrier().sequence();
            const std::vector<float> strided = ReduceUnit(Borrow(comm), S, chunk, in_place);
            const int64_t chunks = (S + chunk - 1) / chunk;
            EXPECT_EQ(comm.Barrier().sequence() - before, chunks + 1);
            // The chunks, then the barrier (RecentOps keeps the last 12 ops; there are at most 5 chunks).
            const std::vector<std::string> recent = comm.RecentOps();
            ASSERT_GT(recent.size(), static_cast<size_t>(chunks));
            int64_t strided_ops = 0;
            for (size_t i = recent.size() - 1 - chunks; i + 1 < recent.size(); ++i) {
              strided_ops += absl::StrContains(recent[i], "ReduceScatterStrided#");
            }
            const bool short_last = S % chunk != 0 && S % chunk < 1024;  // packed
            EXPECT_EQ(strided_ops, power_of_two ? chunks - short_last : 0);
            const std::vector<float> staged = ReduceUnit(Borrow(staged_comm), S, chunk, in_place);
            ASSERT_EQ(strided.size(), staged.size());
            ASSERT_EQ(std::memcmp(strided.data(), staged.data(), strided.size() * 4), 0);
          }
        }
      }
    });
  }
}

// Strided chunks take no staging, so nothing holds them back: all are issued when the collective is created and
// complete in the background, without Join (only Poll, which issues nothing), the result bit for bit that of a
// joined one. (With at most two in flight, as the staged path keeps, the rest waited for Join, so a unit's
// gradients left in chunks only as far as the second while backward went on.)
TEST(UnitCollectiveTest, StridedChunksAllCompleteWithoutJoin) {
  testing::RunRanks(4, [](Communicator& comm, int rank) {
    // The all-gather: five chunks, the last short (every all-gather chunk is strided on Gloo). The reduce-scatter:
    // four whole chunks (a short last one, below 1024 elements, would be packed: the staged path).
    const int64_t S = 4 * 1024 + 96, strided_S = 4 * 1024, chunk = 1024;
    ASSERT_TRUE(advanced::Extended(comm)->SupportsReduceScatterStrided(static_cast<size_t>(chunk), DType::kF32));
    auto poll_until_done = [](internal::UnitCollective& c) {
      const absl::Time deadline = absl::Now() + absl::Seconds(30);
      while (!c.Done() && absl::Now() < deadline) {
        ASSERT_OK(c.Poll());
        absl::SleepFor(absl::Milliseconds(1));
      }
      ASSERT_TRUE(c.Done()) << "the chunks did not all complete without Join";
    };
    auto ctx =
        std::make_unique<internal::EngineContext>(Config::Default(), Borrow(comm), nullptr, nullptr, EngineOptions{});
    ctx->compute = internal::MakeHostCompute(&ctx->tracker);
    internal::BufferPool pool(ctx->compute, MemTag::kStaging);
    // All-gather: every chunk strided.
    const std::vector<uint8_t> shard = ShardBits(rank, S, DType::kF32);
    std::vector<uint8_t> full(static_cast<size_t>(4 * S) * 4, 0xAB);
    internal::UnitCollective g =
        internal::UnitCollective::AllGather(ctx.get(), &pool, shard.data(), full.data(), S, chunk, DType::kF32);
    poll_until_done(g);
    ASSERT_OK(g.Join());  // issues nothing, waits for nothing
    g.ReleaseStaging();
    for (int r = 0; r < 4; ++r) {
      const std::vector<uint8_t> want = ShardBits(r, S, DType::kF32);
      ASSERT_TRUE(std::equal(want.begin(), want.end(), full.begin() + r * S * 4)) << "the shard of rank " << r;
    }
    // Reduce-scatter whose chunks are all strided (a shard of whole 1024-element chunks).
    std::vector<float> src(static_cast<size_t>(4 * strided_S));
    for (size_t i = 0; i < src.size(); ++i) src[i] = std::sin(0.37f * static_cast<float>(i + 5 * rank)) * 13.0f;
    std::vector<float> background(static_cast<size_t>(strided_S), -1.0f);
    internal::UnitCollective c = internal::UnitCollective::ReduceScatter(
        ctx.get(), &pool, src.data(), DType::kF32, background.data(), DType::kF32, strided_S, chunk);
    poll_until_done(c);
    ASSERT_OK(c.Join());
    c.ReleaseStaging();
    std::vector<float> joined(static_cast<size_t>(strided_S), -2.0f);
    internal::UnitCollective j = internal::UnitCollective::ReduceScatter(ctx.get(), &pool, src.data(), DType::kF32,
                                                                         joined.data(), DType::kF32, strided_S, chunk);
    ASSERT_OK(j.Join());
    j.ReleaseStaging();
    ASSERT_EQ(std::memcmp(background.data(), joined.data(), joined.size() * 4), 0);
  });
}

// The engine over a communicator without the strided collectives (its chunks staged: gathers copied out,
// reductions packed) trains the same bits as over Gloo's (in place), and both the bits of one collective per
// unit: stages 1-3, gathers and the step's refresh. With 2048-element buckets at world 2 the largest unit (64x33,
// a shard of 1056) reduces in chunks of 1024 and 32 per rank: the first reads in place, the second is packed.
TEST(UnitCollectiveTest, EngineTrainsTheSameBitsWithoutTheStridedCollectives) {
  struct Run {
    Case c;
    int64_t bucket;
  };
  for (const Run& run :
       {Run{Case{"w2_s3_f32", 2, 3}, 200}, Run{Case{"w3_s3_bf16_ga2", 3, 3, DType::kBF16, 2}, 200},
        Run{Case{"w5_s2_f32", 5, 2}, 200},
        Run{Case{"w4_s3_f32_persistent", 4, 3, DType::kF32, 1, GradAccumulationMode::kLowMemory, false, 1000}, 200},
        Run{Case{"w2_s1_f32", 2, 1}, 2048}, Run{Case{"w2_s2_f32_ga2", 2, 2, DType::kF32, 2}, 2048},
        Run{Case{"w2_s3_f32_b2048", 2, 3}, 2048}}) {
    const Case& c = run.c;
    testing::RunRanks(c.world, [&](Communicator& comm, int) {
      StagingOnly staged_comm(comm);
      SyntheticTrace whole, strided, staged;
      Train(CaseConfig(c, 0), comm, 2, c.ga, &whole);
      Train(CaseConfig(c, run.bucket), comm, 2, c.ga, &strided);
      Train(CaseConfig(c, run.bucket), staged_comm, 2, c.ga, &staged);
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
      ExpectSameBits(strided, staged, absl::StrCat(c.name, ", bucket ", run.bucket, ": in place vs staged"));
      ExpectSameBits(strided, whole, absl::StrCat(c.name, ", bucket ", run.bucket, ": in place vs one collective"));
    });
  }
}

}  // namespace
}  // namespace zero
