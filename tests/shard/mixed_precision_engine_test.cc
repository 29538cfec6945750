// Mixed precision through the Engine: memory formulas (16Ψ, 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N), an inf on one rank
// skipping the step on every rank with the master untouched, the bf16 non-finite policy, and bf16 GPT
// training tracking fp32.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpt/support_threads.h"
#include "support/engine_helpers.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "support/tolerance.h"
#include "support/world_stage.h"
#include "zero/engine.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using ::zero::testing::StatusIs;

Config MixedConfig(int stage, bool fp16) {
  Config c = Config::Default();
  c.zero.stage = stage;
  c.zero.stage3_param_persistence_threshold = 0;
  c.train_micro_batch_size_per_gpu = 1;
  c.train_batch_size.reset();
  c.fp16.enabled = fp16;
  c.bf16.enabled = !fp16;
  c.fp16.initial_scale_power = 8;
  OptimizerConfig o;
  o.type = "AdamW";
  o.lr = 1e-2;
  c.optimizer = o;
  return c;
}

void Init(const std::string& unit, const ParamSpec& p, float* v) {
  for (int64_t i = 0; i < p.numel(); ++i) v[i] = std::sin(static_cast<float>(i + unit.size() * 7 + p.name.size()));
}

using Case = testing::WorldStage;

class MixedMemoryTest : public ::testing::TestWithParam<Case> {};

TEST_P(MixedMemoryTest, ModelStateBytesMatchZeroPaper) {
  const auto [world, stage] = GetParam();
  const std::vector<std::vector<ParamSpec>> units = {{{"a", {31, 17}}, {"b", {3}}}, {{"c", {257}}}, {{"d", {2}}}};
  int64_t psi_pad = 0;
  for (const auto& u : units) {
    int64_t n = 0;
    for (const auto& p : u) n += p.numel();
    const int64_t q = 32 * world;
    psi_pad += (n + q - 1) / q * q;
  }
  testing::RunRanks(world, [&](Communicator& comm_ref, int rank) {
    auto comm = testing::Borrow(comm_ref);
    ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(MixedConfig(stage, /*fp16=*/false), comm));
    for (size_t i = 0; i < units.size(); ++i) ASSERT_OK(engine->AddUnit(absl::StrCat("u", i), units[i]));
    ASSERT_OK(engine->Finalize(Init));
    const MemoryReport m = engine->memory_report();
    const int64_t N = world;
    const int64_t expect[] = {16 * psi_pad, 4 * psi_pad + 12 * psi_pad / N, 2 * psi_pad + 14 * psi_pad / N,
                              16 * psi_pad / N};
    EXPECT_EQ(m.ModelStateBytes(), expect[stage]) << "rank " << rank;
    // fp32 master: full at stage 0, else this rank's shard only.
    EXPECT_EQ(m.Get(MemTier::kDevice, MemTag::kMaster).current, stage == 0 ? 4 * psi_pad : 4 * psi_pad / N);
  });
}

INSTANTIATE_TEST_SUITE_P(Stages, MixedMemoryTest,
                         ::testing::Values(Case{1, 0}, Case{2, 0}, Case{2, 1}, Case{2, 2}, Case{2, 3}, Case{4, 0},
                                           Case{4, 1}, Case{4, 2}, Case{4, 3}, Case{3, 3}),
                         testing::WorldStageName);

// One rank's gradient holds an inf: all four ranks skip the same step, the fp32 master is bit-identical, the
// loss scaler spends hysteresis identically everywhere, and the next clean step applies.
class OverflowTest : public ::testing::TestWithParam<int> {};

TEST_P(OverflowTest, InfOnOneRankSkipsEverywhere) {
  const int stage = GetParam();
  testing::RunRanks(4, [&](Communicator& comm_ref, int rank) {
    auto comm = testing::Borrow(comm_ref);
    ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(MixedConfig(stage, /*fp16=*/true), comm));
    ASSERT_OK_AND_ASSIGN(UnitId u, engine->AddUnit("fc", {{"w", {37, 11}}, {"b", {11}}}));
    ASSERT_OK(engine->Finalize(Init));
    auto backward = [&](bool poison) {
      ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Backward(u));
      ASSERT_OK_AND_ASSIGN(uint16_t * g, s.Grad<uint16_t>("w"));
      for (int64_t i = 0; i < 37 * 11; ++i) g[i] = F32ToF16(0.01f * static_cast<float>((i + rank) % 5));
      if (poison && rank == 2) g[100] = 0x7C00;  // +inf in fp16
    };
    backward(false);
    ASSERT_OK_AND_ASSIGN(StepResult first, engine->Step());
    EXPECT_FALSE(first.skipped);
    ASSERT_OK_AND_ASSIGN(std::vector<float> before, engine->GatherParam(u, "w"));
    const double scale_before = engine->loss_scale();
    backward(true);
    ASSERT_OK_AND_ASSIGN(StepResult r, engine->Step());
    EXPECT_TRUE(r.skipped) << "rank " << rank;
    EXPECT_EQ(engine->steps(), 1);
    ASSERT_OK_AND_ASSIGN(std::vector<float> after, engine->GatherParam(u, "w"));
    ASSERT_EQ(before.size(), after.size());
    for (size_t i = 0; i < before.size(); ++i) {
      ASSERT_EQ(FloatBits(before[i]), FloatBits(after[i])) << "element " << i << " rank " << rank;
    }
    EXPECT_EQ(engine->loss_scale(), scale_before);  // hysteresis 2: the first overflow keeps the scale
    backward(true);
    ASSERT_OK_AND_ASSIGN(StepResult r2, engine->Step());
    EXPECT_TRUE(r2.skipped);
    EXPECT_EQ(engine->loss_scale(), scale_before / 2);  // hysteresis used up: halved on every rank
    backward(false);
    ASSERT_OK_AND_ASSIGN(StepResult r3, engine->Step());
    EXPECT_FALSE(r3.skipped);
    EXPECT_EQ(engine->steps(), 2);
  });
}

INSTANTIATE_TEST_SUITE_P(Stages, OverflowTest, ::testing::Values(0, 1, 2, 3));

TEST(Bf16PolicyTest, NonFiniteIsAnErrorWhenConfigured) {
  testing::RunRanks(2, [&](Communicator& comm_ref, int rank) {
    auto comm = testing::Borrow(comm_ref);
    Config c = MixedConfig(2, /*fp16=*/false);
    c.bf16.nonfinite_grads = NonFinitePolicy::kError;
    ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(c, comm));
    ASSERT_OK_AND_ASSIGN(UnitId u, engine->AddUnit("fc", {{"w", {64}}}));
    ASSERT_OK(engine->Finalize(Init));
    {
      ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Backward(u));
      ASSERT_OK_AND_ASSIGN(uint16_t * g, s.Grad<uint16_t>("w"));
      if (rank == 1) g[3] = 0x7FC0;  // NaN in bf16
    }
    auto r = engine->Step();
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("bf16.nonfinite_grads")));
  });
}

// bf16 GPT training at world 4, stage 3 tracks fp32: 10-step mean losses within 2% over 40 steps (the 200-step
// curves are in bench/results/mixed-precision-gpt.md).
TEST(Bf16GptTest, TracksFp32) {
  auto run = [](bool bf16) {
    Config c = Config::Default();
    c.zero.stage = 3;
    c.zero.stage3_param_persistence_threshold = 0;
    c.train_micro_batch_size_per_gpu = 2;
    c.train_batch_size.reset();
    c.bf16.enabled = bf16;
    c.optimizer->lr = 3e-3;
    gpt::TrainOptions opt;
    opt.steps = 40;
    opt.seq = 16;
    opt.local_world_size = 4;
    auto r = gpt::RunThreadRanks(4, c, opt);
    EXPECT_OK(r);
    return r.ok() ? (*r)[0] : gpt::TrainResult{};
  };
  gpt::TrainResult f32 = run(false), b16 = run(true);
  ASSERT_EQ(f32.steps.size(), b16.steps.size());
  // Per-step losses are noisy (each step is a different batch); compare 10-step means. Measured at most 0.34 %
  // (the Haswell and Zen OpenBLAS kernels; 0.18-0.32 % under the others, the same under every SIMD target):
  // 2 % leaves 6x (bench/results/cpu-targets.md).
  testing::Deviation mean("10-step mean loss vs fp32", 0.02);
  for (size_t w = 0; w + 10 <= f32.steps.size(); w += 10) {
    double mf = 0, mb = 0;
    for (size_t s = w; s < w + 10; ++s) {
      mf += f32.steps[s].loss / 10;
      mb += b16.steps[s].loss / 10;
    }
    EXPECT_TRUE(mean.Add(std::abs(mb - mf) / mf)) << "steps " << w << ".." << w + 9 << ": " << mb << " vs " << mf;
  }
  EXPECT_LT(b16.steps.back().loss, b16.steps.front().loss - 0.5);
}

}  // namespace
}  // namespace zero
