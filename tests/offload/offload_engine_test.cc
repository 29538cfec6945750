// Optimizer and parameter offload through the Engine (zero_optimization.offload_optimizer / offload_param):
//  - the tiny GPT trained with offload gives bitwise the parameters and losses of the same run without it, for
//    stages 1-3 at world sizes 1-4 in fp32, in bf16 (incl. stochastic rounding), with full stage-3 offload, with
//    Twin-Flow (offload_optimizer.ratio < 1), with gradient accumulation in both modes;
//  - the memory report puts each buffer in its tier, with exact sizes: with stage 3 and full offload the device
//    tier holds only gather buffers and reduction buckets.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpt/train.h"
#include "support/engine_helpers.h"
#include "support/gpt_run.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "zero/config.h"
#include "zero/engine.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using ::zero::testing::StatusIs;

constexpr int kSteps = 8;

struct GptRun {
  std::vector<double> losses;
  std::vector<float> params;
  MemoryReport memory;
};

GptRun Train(int world, const Config& cfg) {
  const gpt::TrainResult r0 = testing::TrainTinyGpt(world, cfg, kSteps);
  GptRun run;
  for (const auto& s : r0.steps) run.losses.push_back(s.loss);
  run.params = r0.final_params;
  run.memory = r0.memory;
  return run;
}

enum class Precision { kF32, kBF16, kBF16Stochastic, kF16 };

Config Base(int stage, Precision p, int ga = 1, GradAccumulationMode mode = GradAccumulationMode::kLowMemory) {
  Config c = testing::TrainConfig(stage, /*micro=*/2, ga, 3e-3, 1.0, mode);
  c.bf16.enabled = p == Precision::kBF16 || p == Precision::kBF16Stochastic;
  c.bf16.stochastic_rounding = p == Precision::kBF16Stochastic;
  c.fp16.enabled = p == Precision::kF16;  // DeepSpeed's defaults: 2^16 start, so the first steps overflow and skip
  c.zero.sub_group_size = 4096;           // several host-step tiles per unit (the copy-back pipeline runs)
  return c;
}

Config Offloaded(Config c, bool params, double ratio = 1.0) {
  c.zero.offload_optimizer.device = OffloadDevice::kCpu;
  c.zero.offload_optimizer.ratio = ratio;
  if (params) c.zero.offload_param.device = OffloadDevice::kCpu;
  return c;
}

void ExpectBitwise(const GptRun& got, const GptRun& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t s = 0; s < want.losses.size(); ++s) {
    EXPECT_EQ(got.losses[s], want.losses[s]) << what << " step " << s;
  }
  ASSERT_EQ(got.params.size(), want.params.size()) << what;
  size_t differ = 0;
  for (size_t i = 0; i < want.params.size(); ++i) {
    differ += std::memcmp(&got.params[i], &want.params[i], 4) != 0;
  }
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << want.params.size() << " final parameters differ";
}

struct Case {
  int world;
  int stage;
  Precision precision;
  bool offload_params = false;
  double ratio = 1.0;
  int ga = 1;
  GradAccumulationMode mode = GradAccumulationMode::kLowMemory;
  bool persistent = false;  // stage 3: small units kept gathered (stage3_param_persistence_threshold)
};

std::string Name(const Case& c) {
  const char* p = c.precision == Precision::kF32    ? "f32"
                  : c.precision == Precision::kBF16 ? "bf16"
                  : c.precision == Precision::kF16  ? "fp16"
                                                    : "bf16sr";
  std::string n = absl::StrCat("world", c.world, "_stage", c.stage, "_", p);
  if (c.offload_params) n += "_params";
  if (c.ratio < 1) n += absl::StrCat("_ratio", static_cast<int>(c.ratio * 100));
  if (c.ga > 1) n += absl::StrCat("_ga", c.ga, c.mode == GradAccumulationMode::kLowMemory ? "lowmem" : "lowcomm");
  if (c.persistent) n += "_persistent";
  return n;
}

class OffloadParityTest : public ::testing::TestWithParam<Case> {};

TEST_P(OffloadParityTest, BitwiseEqualToNoOffload) {
  const Case c = GetParam();
  Config base = Base(c.stage, c.precision, c.ga, c.mode);
  if (c.persistent) base.zero.stage3_param_persistence_threshold = 30000;  // the root unit (18.6 k), not blocks
  const GptRun want = Train(c.world, base);
  const GptRun got = Train(c.world, Offloaded(base, c.offload_params, c.ratio));
  ExpectBitwise(got, want, Name(c));
  // The offloaded run really kept optimizer state in the host tier.
  EXPECT_GT(got.memory.Get(MemTier::kHost, MemTag::kOptimizer).current, 0);
  EXPECT_EQ(want.memory.Get(MemTier::kHost, MemTag::kOptimizer).current, 0);
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (int world = 1; world <= 4; ++world) {
    for (int stage = 1; stage <= 3; ++stage) cases.push_back({world, stage, Precision::kF32});
  }
  for (int stage = 1; stage <= 3; ++stage) cases.push_back({2, stage, Precision::kBF16});
  cases.push_back({3, 3, Precision::kBF16Stochastic});
  cases.push_back({2, 2, Precision::kBF16Stochastic});
  cases.push_back({3, 3, Precision::kF32, /*offload_params=*/true});
  cases.push_back({4, 3, Precision::kBF16, /*offload_params=*/true});
  cases.push_back({2, 3, Precision::kF32, false, /*ratio=*/0.5});
  cases.push_back({3, 3, Precision::kBF16, false, /*ratio=*/0.3});
  cases.push_back({2, 2, Precision::kBF16, false, 1.0, /*ga=*/2, GradAccumulationMode::kLowMemory});
  cases.push_back({2, 3, Precision::kF32, true, 1.0, /*ga=*/2, GradAccumulationMode::kLowCommunication});
  cases.push_back({2, 1, Precision::kBF16, false, 1.0, /*ga=*/3, GradAccumulationMode::kLowMemory});
  cases.push_back({2, 2, Precision::kF16});
  cases.push_back({4, 3, Precision::kF16, /*offload_params=*/true});
  cases.push_back({3, 3, Precision::kBF16, true, 1.0, 1, GradAccumulationMode::kLowMemory, /*persistent=*/true});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Offload, OffloadParityTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return Name(info.param); });

// ---- tiers ----

void Init(const std::string& unit, const ParamSpec& p, float* v) {
  for (int64_t i = 0; i < p.numel(); ++i) v[i] = 0.01f * static_cast<float>((i * 7 + unit.size()) % 13) - 0.06f;
}

// One engine step over three units with a dummy backward, returning this rank's report and the padded shards.
struct TierRun {
  MemoryReport memory;          // Engine::memory_report (incl. the communicator's staging)
  MemoryReport own;             // the engine's own allocations only
  std::vector<int64_t> shards;  // per unit
};

TierRun RunTiers(int world, int rank_to_report, const Config& cfg) {
  const std::vector<std::vector<ParamSpec>> units = {{{"a", {31, 17}}, {"b", {3}}}, {{"c", {1000}}}, {{"d", {64}}}};
  TierRun out;
  testing::RunRanks(world, [&](Communicator& comm_ref, int rank) {
    auto comm = testing::Borrow(comm_ref);
    ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(cfg, comm));
    std::vector<UnitId> ids;
    for (size_t i = 0; i < units.size(); ++i) {
      ASSERT_OK_AND_ASSIGN(UnitId id, engine->AddUnit(absl::StrCat("u", i), units[i]));
      ids.push_back(id);
    }
    ASSERT_OK(engine->Finalize(Init));
    for (UnitId id : ids) {
      ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Forward(id));
    }
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
      ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Backward(*it));
      for (const auto& p : engine->UnitParams(*it)) {
        ASSERT_OK_AND_ASSIGN(const TensorView g, s.Grad(p.name));
        for (int64_t i = 0; i < g.numel; ++i) StoreFromF32(g.data, g.dtype, i, 0.001f * static_cast<float>(i % 5));
      }
    }
    ASSERT_OK_AND_ASSIGN(StepResult r, engine->Step());
    EXPECT_FALSE(r.skipped);
    if (rank == rank_to_report) {
      out.memory = engine->memory_report();
      out.own = engine->memory_tracker().Report();
    }
  });
  for (const auto& u : units) {
    int64_t n = 0;
    for (const auto& p : u) n += p.numel();
    const int64_t q = 32 * world;
    out.shards.push_back((n + q - 1) / q * q / world);
  }
  return out;
}

// Stage 3, bf16, optimizer and parameters offloaded: the host tier holds the 16-bit parameter shards (2 B),
// the reduced 16-bit gradient shards (2 B; fp32 only when accumulating micro-steps), the fp32 master (4 B) and
// Adam's m and v (8 B) — 16 bytes per shard element — and the device tier nothing but gather buffers and
// buckets.
TEST(OffloadTiersTest, FullStage3OffloadLeavesOnlyGathersAndBucketsOnTheDevice) {
  for (int world : {1, 2, 4}) {
    Config cfg = Offloaded(Base(3, Precision::kBF16), /*params=*/true);
    const TierRun t = RunTiers(world, world - 1, cfg);
    int64_t shard_sum = 0;
    for (int64_t s : t.shards) shard_sum += s;
    const MemoryReport& m = t.memory;
    for (MemTag tag : {MemTag::kParams, MemTag::kGrads, MemTag::kMaster, MemTag::kOptimizer, MemTag::kStaging,
                       MemTag::kActivations}) {
      EXPECT_EQ(m.Get(MemTier::kDevice, tag).peak, 0) << "world " << world << " device " << MemTagName(tag);
    }
    EXPECT_GT(m.Get(MemTier::kDevice, MemTag::kGather).peak, 0) << "world " << world;
    EXPECT_GT(m.Get(MemTier::kDevice, MemTag::kBuckets).peak, 0) << "world " << world;
    EXPECT_EQ(m.Get(MemTier::kHost, MemTag::kParams).current, 2 * shard_sum) << "world " << world;
    EXPECT_EQ(m.Get(MemTier::kHost, MemTag::kGrads).current, 2 * shard_sum) << "world " << world;
    EXPECT_EQ(m.Get(MemTier::kHost, MemTag::kMaster).current, 4 * shard_sum) << "world " << world;
    EXPECT_EQ(m.Get(MemTier::kHost, MemTag::kOptimizer).current, 8 * shard_sum) << "world " << world;
  }
}

// Stage 2, fp32, optimizer offload only: the device tier keeps the full parameters (4 B per padded element);
// the host tier the fp32 master copy, m, v and the reduced gradient of the shard (16 B per shard element) plus
// two staging tiles for the copy-back.
TEST(OffloadTiersTest, Stage2OptimizerOffloadSplitsTheState) {
  const int world = 2;
  Config cfg = Offloaded(Base(2, Precision::kF32), /*params=*/false);
  const TierRun t = RunTiers(world, 1, cfg);
  int64_t shard_sum = 0;
  for (int64_t s : t.shards) shard_sum += s;
  const MemoryReport& m = t.memory;
  EXPECT_EQ(m.Get(MemTier::kDevice, MemTag::kParams).current, 4 * shard_sum * world);
  EXPECT_EQ(m.Get(MemTier::kDevice, MemTag::kGrads).current, 0);
  EXPECT_EQ(m.Get(MemTier::kDevice, MemTag::kOptimizer).current, 0);
  EXPECT_EQ(m.Get(MemTier::kDevice, MemTag::kMaster).current, 0);
  EXPECT_EQ(m.Get(MemTier::kHost, MemTag::kGrads).current, 4 * shard_sum);
  EXPECT_EQ(m.Get(MemTier::kHost, MemTag::kMaster).current, 4 * shard_sum);
  EXPECT_EQ(m.Get(MemTier::kHost, MemTag::kOptimizer).current, 8 * shard_sum);
  // Two tiles of min(sub_group_size 4096, largest shard) fp32 elements.
  const int64_t tile = std::min<int64_t>(4096, *std::max_element(t.shards.begin(), t.shards.end()));
  EXPECT_EQ(t.own.Get(MemTier::kHost, MemTag::kStaging).current, 2 * tile * 4);
}

// Twin-Flow: ratio 0.5 at stage 3 splits each shard at a 32-element boundary; the two parts add up to the
// whole shard in every category.
TEST(OffloadTiersTest, TwinFlowSplitsEachShard) {
  const int world = 2;
  const double ratio = 0.5;
  Config cfg = Offloaded(Base(3, Precision::kBF16), /*params=*/false, ratio);
  const TierRun t = RunTiers(world, 0, cfg);
  int64_t host_sum = 0, shard_sum = 0;
  for (int64_t s : t.shards) {
    host_sum += static_cast<int64_t>(ratio * s) / 32 * 32;
    shard_sum += s;
  }
  const MemoryReport& m = t.memory;
  EXPECT_EQ(m.Get(MemTier::kHost, MemTag::kOptimizer).current, 8 * host_sum);
  EXPECT_EQ(m.Get(MemTier::kDevice, MemTag::kOptimizer).current, 8 * (shard_sum - host_sum));
  EXPECT_EQ(m.Get(MemTier::kHost, MemTag::kMaster).current, 4 * host_sum);
  EXPECT_EQ(m.Get(MemTier::kDevice, MemTag::kMaster).current, 4 * (shard_sum - host_sum));
  EXPECT_EQ(m.Get(MemTier::kHost, MemTag::kGrads).current, 2 * host_sum);  // bf16 reduced gradient
  EXPECT_EQ(m.Get(MemTier::kDevice, MemTag::kGrads).current, 2 * (shard_sum - host_sum));
  EXPECT_EQ(m.Get(MemTier::kDevice, MemTag::kParams).current, 2 * shard_sum);  // parameters stay on the device
}

TEST(OffloadConfigTest, TwinFlowWithParameterOffloadIsRejected) {
  testing::RunRanks(1, [&](Communicator& comm_ref, int) {
    Config cfg = Offloaded(Base(3, Precision::kBF16), /*params=*/true, 0.5);
    EXPECT_THAT(Engine::Create(cfg, testing::Borrow(comm_ref)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("offload_optimizer.ratio")));
  });
}

}  // namespace
}  // namespace zero
