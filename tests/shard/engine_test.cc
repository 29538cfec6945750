// Engine tests on real Gloo with N ranks as N threads: layout and memory formulas, misuse errors, and the
// gradient each rank's shard receives (analytically). The tiny GPT's end-to-end parity is gpt_parity_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "support/engine_helpers.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "support/world_stage.h"
#include "zero/engine.h"
#include "zero/logging.h"

namespace zero {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::zero::testing::StatusIs;

Config MakeConfig(int stage, int micro, int ga = 1) {
  Config c = testing::TrainConfig(stage, micro, ga, /*lr=*/1e-3, /*clip=*/0.0);
  c.zero.overlap_comm = false;
  return c;
}

void FillInit(const std::string& unit, const ParamSpec& p, float* v) {
  uint64_t h = std::hash<std::string>{}(unit + "/" + p.name);
  for (int64_t i = 0; i < p.numel(); ++i) v[i] = static_cast<float>((h + 977 * i) % 1000) / 1000.0f - 0.5f;
}

// ---- layout and memory ----

using MemCase = testing::WorldStage;

// Model-state bytes per rank are exactly the ZeRO formulas on the padded sizes (fp32 Adam: 16Ψ, 8Ψ+8Ψ/N,
// 4Ψ+12Ψ/N, 16Ψ/N), and padding is what the padding rule (multiple of 32*N elements per unit) predicts.
class MemoryFormulaTest : public ::testing::TestWithParam<MemCase> {};

TEST_P(MemoryFormulaTest, ModelStateBytesMatchFormula) {
  const auto [world, stage] = GetParam();
  // Prime sizes, a unit smaller than the world size, and one that is not a multiple of anything.
  const std::vector<std::vector<ParamSpec>> units = {
      {{"a", {13, 7}}, {"b", {101}}}, {{"tiny", {3}}}, {{"w", {97, 89}}, {"v", {5}}}, {{"x", {1}}, {"y", {2}}}};
  int64_t psi = 0, psi_pad = 0;
  for (const auto& u : units) {
    int64_t n = 0;
    for (const auto& p : u) n += p.numel();
    psi += n;
    const int64_t q = 32 * world;
    psi_pad += (n + q - 1) / q * q;
  }
  std::vector<MemoryReport> reports(world);
  testing::RunRanks(world, [&](Communicator& comm_ref, int rank) {
    auto comm = testing::Borrow(comm_ref);
    ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(MakeConfig(stage, 1), comm));
    for (size_t i = 0; i < units.size(); ++i) {
      ASSERT_OK(engine->AddUnit(absl::StrCat("u", i), units[i]));
    }
    ASSERT_OK(engine->Finalize(FillInit));
    EXPECT_EQ(engine->num_params(), psi);
    reports[rank] = engine->memory_report();
  });
  const int64_t N = world;
  // Bytes per padded element: full-replica part a, sharded part b (divided by N).
  int64_t a = 0, b = 0;
  switch (stage) {
    case 0:
      a = 16;
      b = 0;
      break;
    case 1:
      a = 8;
      b = 8;
      break;
    case 2:
      a = 4;
      b = 12;
      break;
    case 3:
      a = 0;
      b = 16;
      break;
  }
  int64_t unpadded_sum = 0;
  for (int r = 0; r < world; ++r) {
    const MemoryReport& m = reports[r];
    EXPECT_EQ(m.ModelStateBytes(), a * psi_pad + b * psi_pad / N) << "rank " << r;
    // Without offload every model-state byte is in the compute tier ("device": host DRAM on this engine).
    for (MemTag t : {MemTag::kParams, MemTag::kGrads, MemTag::kOptimizer, MemTag::kMaster}) {
      EXPECT_EQ(m.Get(MemTier::kHost, t).current, 0) << MemTagName(t);
    }
    unpadded_sum += m.ModelStateBytes() - m.padding_bytes;
  }
  // Without padding, the ranks together hold exactly N copies of the replicated part and one of the sharded.
  EXPECT_EQ(unpadded_sum, N * a * psi + b * psi);
}

INSTANTIATE_TEST_SUITE_P(Stages, MemoryFormulaTest,
                         ::testing::Values(MemCase{1, 0}, MemCase{1, 3}, MemCase{2, 0}, MemCase{2, 1}, MemCase{2, 2},
                                           MemCase{2, 3}, MemCase{3, 1}, MemCase{3, 2}, MemCase{3, 3}, MemCase{4, 0},
                                           MemCase{4, 1}, MemCase{4, 2}, MemCase{4, 3}),
                         testing::WorldStageName);

// The communicator's own buffers are part of the report: stage 1 reduce-scatters the persistent full gradient
// with the const-input op, for which Gloo stages a copy of the input (counted under "staging").
TEST(EngineMemoryTest, ReportIncludesCommunicatorStaging) {
  testing::RunRanks(2, [&](Communicator& comm_ref, int rank) {
    auto comm = testing::Borrow(comm_ref);
    ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(MakeConfig(1, 1), comm));
    ASSERT_OK_AND_ASSIGN(UnitId u, engine->AddUnit("fc", {{"w", {1000}}}));
    ASSERT_OK(engine->Finalize(FillInit));
    { ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Backward(u)); }
    ASSERT_OK(engine->Step());
    const int64_t comm_staging = comm_ref.memory_report().Get(MemTier::kHost, MemTag::kStaging).current;
    EXPECT_GE(comm_staging, 1024 * 4);  // the padded unit (1024 f32) staged for the reduce-scatter
    EXPECT_EQ(engine->memory_report().Get(MemTier::kHost, MemTag::kStaging).current, comm_staging);
  });
}

// ---- misuse ----

TEST(EngineMisuseTest, ErrorsNameTheUnit) {
  testing::RunRanks(2, [&](Communicator& comm_ref, int rank) {
    auto comm = testing::Borrow(comm_ref);
    ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(MakeConfig(3, 1), comm));
    ASSERT_OK_AND_ASSIGN(UnitId u, engine->AddUnit("block.0", {{"w", {8, 8}}}));
    // Before Finalize.
    EXPECT_THAT(engine->Forward(u), StatusIs(absl::StatusCode::kFailedPrecondition));
    ASSERT_OK(engine->Finalize(FillInit));
    // After Finalize, no more units.
    EXPECT_THAT(engine->AddUnit("late", {{"w", {2}}}), StatusIs(absl::StatusCode::kFailedPrecondition));
    // Use after release: the stage-3 unit is sharded until a scope opens it.
    EXPECT_EQ(engine->UnitState(u), "NOT_AVAILABLE");
    ASSERT_THAT(engine->Param(u, "w"), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("block.0")));
    {
      ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Forward(u));
      EXPECT_EQ(engine->UnitState(u), "AVAILABLE");
      EXPECT_OK(engine->Param(u, "w"));
      // Gathering twice.
      ASSERT_THAT(engine->Backward(u), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("block.0")));
    }
    EXPECT_EQ(engine->UnitState(u), "NOT_AVAILABLE");
    EXPECT_FALSE(engine->Param(u, "w").ok());
    // Stepping with a backward scope open: gradients outstanding.
    {
      ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Backward(u));
      ASSERT_THAT(engine->Step(), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("block.0")));
    }
    EXPECT_OK(engine->Step());
    // Unknown parameter.
    EXPECT_THAT(engine->Param(u, "nope"), StatusIs(absl::StatusCode::kInvalidArgument));
  });
}

TEST(EngineMisuseTest, PartialAccumulationIsAnError) {
  testing::RunRanks(2, [&](Communicator& comm_ref, int rank) {
    auto comm = testing::Borrow(comm_ref);
    ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(MakeConfig(2, 1, /*ga=*/2), comm));
    ASSERT_OK_AND_ASSIGN(UnitId u, engine->AddUnit("fc", {{"w", {4, 4}}}));
    ASSERT_OK(engine->Finalize(FillInit));
    { ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Backward(u)); }
    ASSERT_THAT(engine->Step(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                         AllOf(HasSubstr("fc"), HasSubstr("gradient_accumulation_steps"))));
    { ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Backward(u)); }
    EXPECT_OK(engine->Step());
  });
}

TEST(EngineMisuseTest, MismatchedRegistrationNamesFirstDifference) {
  testing::RunRanks(3, [&](Communicator& comm_ref, int rank) {
    auto comm = testing::Borrow(comm_ref);
    ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(MakeConfig(1, 1), comm));
    ASSERT_OK(engine->AddUnit("h.0", {{"w", {4, 4}}}));
    ASSERT_OK(engine->AddUnit("h.1", {{"w", {4, rank == 2 ? 5 : 4}}}));
    EXPECT_THAT(engine->Finalize(FillInit), StatusIs(absl::StatusCode::kInvalidArgument,
                                                     AllOf(HasSubstr("rank 2"), HasSubstr("h.1"), HasSubstr("[4,5]"))));
  });
}

// ---- gradients: an analytic check of what each rank's shard receives ----

// A linear "model" whose gradient is known in closed form: loss = sum_i w_i * c_i with c_i = rank-dependent
// input; the averaged gradient of w_i is mean over ranks of c_i. After one SGD step (lr 1, no momentum),
// w_i(1) = w_i(0) - mean_r c_i(r). Checked at every stage, with a prime-sized parameter straddling shards.
class AnalyticGradTest : public ::testing::TestWithParam<MemCase> {};

TEST_P(AnalyticGradTest, SgdStepAppliesTheMeanGradient) {
  const auto [world, stage] = GetParam();
  const int64_t n = 331;  // prime
  testing::RunRanks(world, [&](Communicator& comm_ref, int rank) {
    auto comm = testing::Borrow(comm_ref);
    Config c = MakeConfig(stage, 1);
    OptimizerConfig sgd;
    sgd.type = "SGD";
    sgd.lr = 1.0;
    c.optimizer = sgd;
    ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(c, comm));
    ASSERT_OK_AND_ASSIGN(UnitId u, engine->AddUnit("lin", {{"w", {n}}}));
    ASSERT_OK_AND_ASSIGN(UnitId v, engine->AddUnit("small", {{"z", {1}}}));
    ASSERT_OK(engine->Finalize(FillInit));
    std::vector<float> w0(n);
    FillInit("lin", ParamSpec{"w", {n}}, w0.data());
    {
      ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Backward(u));
      ASSERT_OK_AND_ASSIGN(const float* w, s.Param<float>("w"));
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(w[i], w0[i]) << i;
      ASSERT_OK_AND_ASSIGN(float* g, s.Grad<float>("w"));
      for (int64_t i = 0; i < n; ++i) g[i] += static_cast<float>((rank + 1) * (i % 7));
    }
    {
      ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Backward(v));
      ASSERT_OK_AND_ASSIGN(float* gz, s.Grad<float>("z"));
      gz[0] += 4.0f * rank;
    }
    ASSERT_OK_AND_ASSIGN(StepResult r, engine->Step());
    EXPECT_FALSE(r.skipped);
    const double mean_factor = (world + 1) / 2.0;  // mean of (rank + 1)
    double sumsq = 0;
    for (int64_t i = 0; i < n; ++i) sumsq += std::pow(mean_factor * (i % 7), 2);
    sumsq += std::pow(4.0 * (world - 1) / 2.0, 2);
    EXPECT_NEAR(r.grad_norm, std::sqrt(sumsq), 1e-4 * std::sqrt(sumsq));
    ASSERT_OK_AND_ASSIGN(std::vector<float> w1, engine->GatherParam(u, "w"));
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(w1[i], w0[i] - mean_factor * (i % 7), 1e-5) << "element " << i << " rank " << rank;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Stages, AnalyticGradTest,
                         ::testing::Values(MemCase{1, 0}, MemCase{2, 0}, MemCase{2, 1}, MemCase{2, 2}, MemCase{2, 3},
                                           MemCase{3, 3}, MemCase{4, 1}, MemCase{4, 2}, MemCase{4, 3}),
                         testing::WorldStageName);

}  // namespace
}  // namespace zero
