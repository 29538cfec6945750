// The placement plan (shard/internal/plan.h) on its own: the ZeRO byte formulas over every stage × compute dtype ×
// offload × accumulation mode × world size 1-8 from the plan alone (no threads, no communicator), and a running
// engine whose memory report equals the plan made from its config.
#include "shard/internal/plan.h"

#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "support/engine_helpers.h"
#include "support/multi_rank.h"
#include "support/synthetic_trainer.h"
#include "zero/engine.h"
#include "zero/logging.h"

namespace zero {
namespace {

using internal::BufferRole;
using internal::MakePlan;
using internal::PlanPolicy;
using internal::StagePlan;

enum class Offload { kNone, kOptimizer, kOptimizerAndParams };
const char* OffloadName(Offload o) {
  switch (o) {
    case Offload::kNone: return "none";
    case Offload::kOptimizer: return "opt";
    case Offload::kOptimizerAndParams: return "opt_param";
  }
  return "?";
}

// Odd sizes: a unit smaller than any world size, one that is prime, and one that is a multiple of nothing.
const std::vector<int64_t> kNumels = {13 * 7 + 101, 3, 97 * 89 + 5, 2};

int64_t Padded(int64_t n, int world) {
  const int64_t q = 32 * world;
  return (n + q - 1) / q * q;
}

PlanPolicy Policy(int stage, DType cd, Offload off, GradAccumulationMode mode, int ga, int world, int rank) {
  PlanPolicy p;
  p.stage = stage;
  p.world = world;
  p.rank = rank;
  p.compute = cd;
  p.accumulation_steps = ga;
  p.accumulation_mode = mode;
  p.offload_optimizer = off != Offload::kNone && stage >= 1;
  p.offload_param = off == Offload::kOptimizerAndParams && stage == 3;
  p.pin_optimizer = p.pin_param = true;
  p.persistence_threshold = 0;  // every stage-3 unit sharded
  p.model_persistence_threshold = 0;
  p.sub_group_size = 1000;
  p.optimizer_states = 2;  // Adam
  return p;
}

// Bytes per padded element of the replicated part (a) and per shard element of the sharded part (b), in each
// tier, written out from the ZeRO paper's accounting and docs/internals/design.md's table (independently of plan.cc).
struct PerElem {
  int64_t dev_a = 0, dev_b = 0, host_b = 0;
};
PerElem Expected(int stage, DType cd, Offload off, int ga) {
  const int64_t c = DTypeSize(cd);
  const bool mixed = cd != DType::kF32, acc16 = mixed && ga > 1;
  const bool off_opt = off != Offload::kNone && stage >= 1;
  const bool off_param = off == Offload::kOptimizerAndParams && stage == 3;
  const int64_t g = (c == 4 || ga > 1) ? 4 : c;  // the reduced gradient shard's element size
  PerElem e;
  // Parameters.
  if (stage < 3) {
    e.dev_a += c;
  } else {
    (off_param ? e.host_b : e.dev_b) += c;
  }
  // Gradients: the persistent full buffer (stages 0-1), stage 0's fp32 accumulator, the reduced shard.
  if (stage <= 1) e.dev_a += c;
  if (stage == 0 && acc16) e.dev_a += 4;
  if (stage >= 2 || (stage == 1 && (acc16 || off_opt))) (off_opt ? e.host_b : e.dev_b) += g;
  // fp32 master: none with fp32 compute (the parameters are the master) unless offload keeps a host copy of
  // a shard whose parameters stay in the compute tier.
  if (stage == 0) {
    if (mixed) e.dev_a += 4;
  } else if (off_opt) {
    if (!(off_param && !mixed)) e.host_b += 4;
  } else if (mixed) {
    e.dev_b += 4;
  }
  // Adam's two fp32 states.
  if (stage == 0) {
    e.dev_a += 8;
  } else {
    (off_opt ? e.host_b : e.dev_b) += 8;
  }
  return e;
}

int64_t ModelState(const MemoryReport& r, MemTier tier) {
  int64_t s = 0;
  for (MemTag t : {MemTag::kParams, MemTag::kGrads, MemTag::kOptimizer, MemTag::kMaster}) s += r.Get(tier, t).current;
  return s;
}

struct PlanCase {
  int stage;
  DType cd;
  Offload off;
  GradAccumulationMode mode;
  int ga;
};

class PlanTableTest : public ::testing::TestWithParam<PlanCase> {};

TEST_P(PlanTableTest, FormulasHoldAtEveryWorldSizeAndRank) {
  const PlanCase c = GetParam();
  const PerElem e = Expected(c.stage, c.cd, c.off, c.ga);
  for (int world = 1; world <= 8; ++world) {
    int64_t psi_pad = 0, pad_elems = 0, max_shard = 0;
    for (int64_t n : kNumels) {
      psi_pad += Padded(n, world);
      pad_elems += Padded(n, world) - n;
      max_shard = std::max(max_shard, Padded(n, world) / world);
    }
    int64_t padding_all_ranks = 0, full_bytes_per_pad = 0, shard_bytes_per_pad = 0;
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE(absl::StrCat("world ", world, " rank ", rank));
      const StagePlan plan = MakePlan(Policy(c.stage, c.cd, c.off, c.mode, c.ga, world, rank), kNumels);
      const MemoryReport r = plan.Report();
      EXPECT_EQ(ModelState(r, MemTier::kDevice), e.dev_a * psi_pad + e.dev_b * psi_pad / world);
      EXPECT_EQ(ModelState(r, MemTier::kHost), e.host_b * psi_pad / world);
      // The ZeRO paper's totals, whatever the tier.
      EXPECT_EQ(r.ModelStateBytes(), (e.dev_a * psi_pad) + (e.dev_b + e.host_b) * psi_pad / world);
      // Nothing transient is planned.
      for (MemTier t : {MemTier::kHost, MemTier::kDevice}) {
        EXPECT_EQ(r.Get(t, MemTag::kGather).current, 0);
        EXPECT_EQ(r.Get(t, MemTag::kBuckets).current, 0);
        EXPECT_EQ(r.Get(t, MemTag::kActivations).current, 0);
      }
      // The copy-back staging: two tiles of the compute dtype when parameters in the compute tier get their
      // update from the host (offload_param applies at stage 3 only).
      const bool staged =
          c.off != Offload::kNone && c.stage >= 1 && !(c.off == Offload::kOptimizerAndParams && c.stage == 3);
      const int64_t tile = std::min<int64_t>(1000, max_shard);
      EXPECT_EQ(r.Get(MemTier::kHost, MemTag::kStaging).current, staged ? 2 * tile * DTypeSize(c.cd) : 0);
      padding_all_ranks += r.padding_bytes;
      // Every unit's buffers: each full-size buffer holds the unit's padding on every rank, each shard-size buffer
      // holds it once across the ranks.
      full_bytes_per_pad = shard_bytes_per_pad = 0;
      for (const auto& u : plan.units) {
        for (const auto& b : u.buffers) {
          ASSERT_TRUE(b.elems == u.padded || b.elems == u.shard) << internal::BufferRoleName(b.role);
          (b.elems == u.padded && u.padded != u.shard ? full_bytes_per_pad : shard_bytes_per_pad) += DTypeSize(b.dtype);
          if (b.tier == MemTier::kDevice) {
            EXPECT_FALSE(b.pinned);
          }
        }
        break;  // the first unit's roles are every unit's
      }
    }
    if (world > 1) {
      EXPECT_EQ(padding_all_ranks, full_bytes_per_pad * pad_elems * world + shard_bytes_per_pad * pad_elems)
          << "world " << world;
    }
  }
}

std::vector<PlanCase> AllCases() {
  std::vector<PlanCase> cases;
  for (int stage = 0; stage <= 3; ++stage) {
    for (DType cd : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (Offload off : {Offload::kNone, Offload::kOptimizer, Offload::kOptimizerAndParams}) {
        for (auto mode : {GradAccumulationMode::kLowMemory, GradAccumulationMode::kLowCommunication}) {
          for (int ga : {1, 4}) cases.push_back({stage, cd, off, mode, ga});
        }
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Plan, PlanTableTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<PlanCase>& i) {
                           const PlanCase& c = i.param;
                           return absl::StrCat(
                               "stage", c.stage, "_", std::string(DTypeName(c.cd)), "_", OffloadName(c.off), "_",
                               c.mode == GradAccumulationMode::kLowMemory ? "lowmem" : "lowcomm", "_ga", c.ga);
                         });

// The paper's formulas spelled out (Adam, one micro-step, no offload): fp32 16Ψ, 8Ψ+8Ψ/N, 4Ψ+12Ψ/N, 16Ψ/N;
// 16-bit 16Ψ, 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N.
TEST(PlanTest, PaperFormulas) {
  const int N = 4;
  const std::vector<int64_t> one = {1 << 12};  // a multiple of 32 × N: no padding
  const int64_t psi = one[0];
  const int64_t fp32[4] = {16 * psi, 8 * psi + 8 * psi / N, 4 * psi + 12 * psi / N, 16 * psi / N};
  const int64_t b16[4] = {16 * psi, 4 * psi + 12 * psi / N, 2 * psi + 14 * psi / N, 16 * psi / N};
  for (int stage = 0; stage <= 3; ++stage) {
    for (DType cd : {DType::kF32, DType::kBF16}) {
      const StagePlan p = MakePlan(Policy(stage, cd, Offload::kNone, GradAccumulationMode::kLowMemory, 1, N, 1), one);
      EXPECT_EQ(p.Report().ModelStateBytes(), cd == DType::kF32 ? fp32[stage] : b16[stage])
          << "stage " << stage << " " << DTypeName(cd);
      EXPECT_EQ(p.Report().padding_bytes, 0);
    }
  }
}

// Stage 3 keeps units below stage3_param_persistence_threshold gathered, up to stage3_model_persistence_threshold
// in total, deciding in registration order.
TEST(PlanTest, PersistentUnitsStayWhole) {
  PlanPolicy p = Policy(3, DType::kF32, Offload::kNone, GradAccumulationMode::kLowMemory, 1, 4, 0);
  p.persistence_threshold = 100;
  p.model_persistence_threshold = 4;            // room for 3 + ... but not 3 + 2
  const StagePlan plan = MakePlan(p, kNumels);  // 192, 3, 8638, 2
  ASSERT_EQ(plan.units.size(), 4u);
  EXPECT_FALSE(plan.units[0].persistent);
  EXPECT_TRUE(plan.units[1].persistent);
  EXPECT_FALSE(plan.units[2].persistent);
  EXPECT_FALSE(plan.units[3].persistent);  // 3 + 2 > 4
  const auto* params = plan.units[1].Find(BufferRole::kParams);
  ASSERT_NE(params, nullptr);
  EXPECT_EQ(params->elems, plan.units[1].padded);
  EXPECT_FALSE(plan.units[1].sharded_params);
  EXPECT_EQ(plan.units[2].Find(BufferRole::kParams)->elems, plan.units[2].shard);
}

// Twin-Flow (offload_optimizer.ratio < 1): the host part is ratio × S rounded down to whole 32-element blocks, the
// rest stays in the compute tier, and the totals are those of full offload.
TEST(PlanTest, TwinFlowSplitsEveryShard) {
  PlanPolicy p = Policy(3, DType::kBF16, Offload::kOptimizer, GradAccumulationMode::kLowMemory, 1, 2, 0);
  p.offload_ratio = 0.5;
  const StagePlan plan = MakePlan(p, {4096 + 64});
  const auto& u = plan.units[0];
  EXPECT_EQ(u.shard, 2080);
  EXPECT_EQ(u.host_n, 1024);  // 1040 rounded down to 32
  EXPECT_EQ(u.Find(BufferRole::kMaster)->elems, u.shard - u.host_n);
  EXPECT_EQ(u.Find(BufferRole::kHostMaster)->elems, u.host_n);
  EXPECT_EQ(u.Find(BufferRole::kState, 1)->elems, u.shard - u.host_n);
  EXPECT_EQ(u.Find(BufferRole::kHostState, 1)->elems, u.host_n);
  PlanPolicy full = p;
  full.offload_ratio = 1.0;
  EXPECT_EQ(plan.Report().ModelStateBytes(), MakePlan(full, {4096 + 64}).Report().ModelStateBytes());
}

TEST(PlanTest, PolicyFromConfigNamesImpossibleCombinations) {
  Config c = testing::TrainConfig(3, 1);
  c.zero.offload_optimizer.device = OffloadDevice::kCpu;
  c.zero.offload_param.device = OffloadDevice::kCpu;
  c.zero.offload_optimizer.ratio = 0.5;
  EXPECT_THAT(PlanPolicy::FromConfig(c, 2, 0),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("offload_optimizer.ratio")));
  c.zero.offload_optimizer.ratio = 1.0;
  c.zero.stage = 2;  // offload_param applies at stage 3 only
  ASSERT_OK_AND_ASSIGN(PlanPolicy q, PlanPolicy::FromConfig(c, 2, 0));
  EXPECT_TRUE(q.offload_optimizer);
  EXPECT_FALSE(q.offload_param);
}

// What Finalize says about stage-3 units that will not be sharded between uses: those below the persistence
// threshold (they stay gathered), and a whole model registered as one unit (gathered whole in every scope).
TEST(PlanLogTest, Stage3SaysWhatStaysGatheredAndWhatIsGatheredWhole) {
  std::vector<std::string> lines;
  std::mutex mu;
  SetLogSink([&](LogLevel, std::string_view line) {
    std::lock_guard<std::mutex> lock(mu);
    lines.emplace_back(line);
  });
  testing::RunRanks(2, [&](Communicator& comm, int) {
    Config cfg = testing::TrainConfig(3, 1);
    cfg.zero.stage3_param_persistence_threshold = 100;
    ASSERT_OK_AND_ASSIGN(auto e, Engine::Create(cfg, testing::Borrow(comm)));
    // One "model" unit of four tensors holding almost everything, and a small one below the threshold.
    ASSERT_OK(e->AddUnit("model", {{"wte", {64, 32}}, {"w1", {32, 32}}, {"w2", {32, 32}}, {"b", {32}}}));
    ASSERT_OK(e->AddUnit("head_bias", {{"b", {10}}}));
    ASSERT_OK(e->Finalize([](const std::string&, const ParamSpec& p, float* v) {
      for (int64_t i = 0; i < p.numel(); ++i) v[i] = 0.01f * static_cast<float>(i % 7);
    }));
  });
  SetLogSink(nullptr);
  auto has = [&](const std::string& text) {
    for (const auto& l : lines) {
      if (l.find(text) != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_TRUE(
      has("stage 3: unit model holds 98 % of the parameters (4160 elements): every Forward/Backward scope "
          "gathers it whole"));
  EXPECT_TRUE(
      has("stage 3: 1 of 2 units (64 parameter elements, 256 bytes) are below "
          "stage3_param_persistence_threshold (100) and stay gathered on every rank, as at stage 2: head_bias"));
}

// ---- a running engine's memory equals its plan ----

struct EngineCase {
  int world;
  int stage;
  bool bf16;
  Offload off;
  GradAccumulationMode mode;
};

class EngineMatchesPlanTest : public ::testing::TestWithParam<EngineCase> {};

// Right after Finalize the engine's own tracker holds exactly the plan's buffers, padding included; after training
// steps its model state and staging are still the plan's (the gathers and buckets it pools come on top).
TEST_P(EngineMatchesPlanTest, MemoryReportEqualsPlan) {
  const EngineCase c = GetParam();
  Config cfg = testing::TrainConfig(c.stage, 1, /*ga=*/2, 1e-3, 1.0, c.mode);
  cfg.bf16.enabled = c.bf16;
  cfg.zero.sub_group_size = 500;
  if (c.off != Offload::kNone) cfg.zero.offload_optimizer.device = OffloadDevice::kCpu;
  if (c.off == Offload::kOptimizerAndParams) cfg.zero.offload_param.device = OffloadDevice::kCpu;
  std::vector<int64_t> numels;
  for (const auto& [name, specs] : testing::SyntheticUnits()) {
    int64_t n = 0;
    for (const auto& s : specs) n += s.numel();
    numels.push_back(n);
  }
  testing::RunRanks(c.world, [&](Communicator& comm, int rank) {
    ASSERT_OK_AND_ASSIGN(PlanPolicy policy, PlanPolicy::FromConfig(cfg, c.world, rank));
    policy.optimizer_states = 2;
    const MemoryReport want = MakePlan(policy, numels).Report();
    ASSERT_OK_AND_ASSIGN(auto engine, testing::MakeSyntheticEngine(cfg, testing::Borrow(comm)));
    const MemoryReport got = engine->memory_tracker().Report();
    for (MemTier tier : {MemTier::kHost, MemTier::kDevice}) {
      for (size_t t = 0; t < static_cast<size_t>(MemTag::kCount); ++t) {
        const MemTag tag = static_cast<MemTag>(t);
        EXPECT_EQ(got.Get(tier, tag).current, want.Get(tier, tag).current)
            << "after Finalize: " << MemTagName(tag) << "@" << MemTierName(tier);
      }
    }
    EXPECT_EQ(got.padding_bytes, want.padding_bytes);
    testing::SyntheticTrace trace;
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*engine, 3, 2, testing::HostViewIo(), &trace));
    const MemoryReport after = engine->memory_tracker().Report();
    for (MemTier tier : {MemTier::kHost, MemTier::kDevice}) {
      for (MemTag tag : {MemTag::kParams, MemTag::kGrads, MemTag::kOptimizer, MemTag::kMaster, MemTag::kStaging}) {
        EXPECT_EQ(after.Get(tier, tag).current, want.Get(tier, tag).current)
            << "after 3 steps: " << MemTagName(tag) << "@" << MemTierName(tier);
      }
    }
  });
}

std::vector<EngineCase> EngineCases() {
  std::vector<EngineCase> cases;
  for (int world : {1, 3}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (bool bf16 : {false, true}) {
        for (Offload off : {Offload::kNone, Offload::kOptimizer, Offload::kOptimizerAndParams}) {
          if (off != Offload::kNone && stage == 0) continue;
          if (off == Offload::kOptimizerAndParams && stage != 3) continue;
          cases.push_back({world, stage, bf16, off, GradAccumulationMode::kLowMemory});
        }
      }
      cases.push_back({world, stage, true, Offload::kNone, GradAccumulationMode::kLowCommunication});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Engine, EngineMatchesPlanTest, ::testing::ValuesIn(EngineCases()),
                         [](const ::testing::TestParamInfo<EngineCase>& i) {
                           const EngineCase& c = i.param;
                           return absl::StrCat("world", c.world, "_stage", c.stage, c.bf16 ? "_bf16" : "_fp32", "_",
                                               OffloadName(c.off),
                                               c.mode == GradAccumulationMode::kLowMemory ? "" : "_lowcomm");
                         });

// Chunking's geometry: one collective while the unit fits its bucket; else the largest multiple of 32 elements
// per rank whose `world` blocks fit the bucket, and never below 32 (the shard alignment) however small the bucket.
TEST(ChunkPerRankTest, WholeMultiplesOf32WithinTheBucket) {
  EXPECT_EQ(internal::ChunkPerRank(1024, 4, 1024), 0);         // fits: one collective
  EXPECT_EQ(internal::ChunkPerRank(1024, 4, 500'000'000), 0);  // DeepSpeed's default never chunks this
  EXPECT_EQ(internal::ChunkPerRank(1152, 4, 1024), 256);       // 4 x 256 = the bucket
  EXPECT_EQ(internal::ChunkPerRank(4096, 3, 1000), 320);       // 1000 / 3 = 333 -> 320; 3 x 320 <= 1000
  EXPECT_EQ(internal::ChunkPerRank(4096, 5, 100), 32);         // below 32 per rank: 32
  EXPECT_EQ(internal::ChunkPerRank(4096, 2, 0), 32);           // a bucket of 0 too
  for (int world = 1; world <= 8; ++world) {
    for (int64_t bucket : {int64_t{64}, int64_t{1000}, int64_t{77777}}) {
      const int64_t c = internal::ChunkPerRank(int64_t{1} << 20, world, bucket);
      EXPECT_EQ(c % 32, 0);
      EXPECT_TRUE(c == 32 || c * world <= bucket) << "world " << world << " bucket " << bucket;
      EXPECT_GT((c + 32) * world, bucket) << "the largest such chunk";
    }
  }
}

}  // namespace
}  // namespace zero
