// The trainer's mistakes, replayed as a trainer would make them, are errors and never aborts (include/zero/engine.h,
// "ERRORS AND ABORTS"): a parameter-name typo, Grad in a forward scope, a view typed as the wrong dtype, a closed,
// moved-from or default-constructed scope, a unit that is not gathered, an unknown unit id, a frozen unit's
// gradient, and a parameter group whose pattern matches nothing (Engine and ShardedOptimizer). Each runs on every
// rank of a Gloo world as threads, every rank makes the mistake, and every rank gets the error, whose message names
// the unit, the parameter, the dtype and the rank; the engine then trains on as if the mistake had not been made.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "support/engine_helpers.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "support/world_stage.h"
#include "zero/engine.h"
#include "zero/sharded_optimizer.h"

namespace zero {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::zero::testing::StatusIs;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
constexpr absl::StatusCode kPrecondition = absl::StatusCode::kFailedPrecondition;

Config MakeConfig(int stage, bool bf16 = false) {
  Config c = testing::TrainConfig(stage, 1, 1, /*lr=*/1e-3, /*clip=*/0.0);
  c.zero.overlap_comm = false;
  c.bf16.enabled = bf16;
  return c;
}

void Init(const std::string& unit, const ParamSpec& p, float* v) {
  for (int64_t i = 0; i < p.numel(); ++i) v[i] = 0.01f * static_cast<float>((i + unit.size()) % 17) - 0.08f;
}

std::string OnRank(int rank) { return absl::StrCat("on rank ", rank); }

// An engine with unit "block.0" {w, b} (and "head" {w}), finalized at `stage`.
std::unique_ptr<Engine> MakeEngine(Communicator& comm, int stage, bool bf16 = false, EngineOptions options = {}) {
  auto e = Engine::Create(MakeConfig(stage, bf16), testing::Borrow(comm), std::move(options));
  EXPECT_OK(e);
  if (!e.ok()) return nullptr;
  EXPECT_OK((*e)->AddUnit("block.0", {{"w", {8, 8}}, {"b", {8}}}));
  EXPECT_OK((*e)->AddUnit("head", {{"w", {8, 4}}}));
  EXPECT_OK((*e)->Finalize(Init));
  return std::move(*e);
}

// One ordinary training step after a mistake: the mistake changed nothing, so every rank still steps together.
void TrainOneStep(Engine& e) {
  for (UnitId id : {e.FindUnit("block.0"), e.FindUnit("head")}) ASSERT_OK(e.Forward(id).status());
  for (UnitId id : {e.FindUnit("head"), e.FindUnit("block.0")}) {
    ASSERT_OK_AND_ASSIGN(UnitScope s, e.Backward(id));
    ASSERT_OK_AND_ASSIGN(float* g, s.Grad<float>("w"));
    g[0] += 0.5f;
  }
  ASSERT_OK_AND_ASSIGN(StepResult r, e.Step());
  EXPECT_GT(r.grad_norm, 0.0);
}

class MisuseTest : public ::testing::TestWithParam<testing::WorldStage> {};

TEST_P(MisuseTest, ParameterNameTypoIsAnErrorListingTheNames) {
  const auto [world, stage] = GetParam();
  testing::RunRanks(world, [&](Communicator& comm, int rank) {
    auto e = MakeEngine(comm, stage);
    ASSERT_NE(e, nullptr);
    const UnitId u = e->FindUnit("block.0");
    const auto typo = AllOf(HasSubstr("\"weigth\""), HasSubstr("unit block.0"), HasSubstr(OnRank(rank)),
                            HasSubstr("its parameters are w, b"));
    {
      ASSERT_OK_AND_ASSIGN(UnitScope s, e->Forward(u));
      EXPECT_THAT(s.Param("weigth"), StatusIs(kInvalid, AllOf(typo, HasSubstr("UnitScope::Param"))));
      EXPECT_THAT(s.Param<float>("weigth"), StatusIs(kInvalid, typo));
      EXPECT_OK(s.Param("w"));  // the scope is still good
      EXPECT_THAT(e->Param(u, "weigth"), StatusIs(kInvalid, AllOf(typo, HasSubstr("Engine::Param"))));
    }
    {
      ASSERT_OK_AND_ASSIGN(UnitScope s, e->Backward(u));
      EXPECT_THAT(s.Grad("weigth"), StatusIs(kInvalid, AllOf(typo, HasSubstr("UnitScope::Grad"))));
      EXPECT_THAT(s.Grad<float>("weigth"), StatusIs(kInvalid, typo));
    }
    std::vector<float> values(64, 0.25f);
    EXPECT_THAT(e->CopyIn(u, "weigth", values.data()), StatusIs(kInvalid, typo));
    EXPECT_THAT(e->GatherParam(u, "weigth"), StatusIs(kInvalid, typo));
    ASSERT_OK(e->Step());  // ends the step whose backward scope made the mistakes
    ASSERT_NO_FATAL_FAILURE(TrainOneStep(*e));
  });
}

TEST_P(MisuseTest, GradInAForwardScopeIsAnError) {
  const auto [world, stage] = GetParam();
  testing::RunRanks(world, [&](Communicator& comm, int rank) {
    auto e = MakeEngine(comm, stage);
    ASSERT_NE(e, nullptr);
    {
      ASSERT_OK_AND_ASSIGN(UnitScope s, e->Forward(e->FindUnit("block.0")));
      const auto forward = AllOf(HasSubstr("unit block.0"), HasSubstr("forward scope"), HasSubstr(OnRank(rank)));
      EXPECT_THAT(s.Grad("w"), StatusIs(kPrecondition, AllOf(forward, HasSubstr("UnitScope::Grad(\"w\")"))));
      EXPECT_THAT(s.Grad<float>("w"), StatusIs(kPrecondition, forward));
      EXPECT_THAT(s.GradBase(), StatusIs(kPrecondition, AllOf(forward, HasSubstr("UnitScope::GradBase()"))));
      // The unchecked base is null rather than a buffer the trainer must not write (stages 0-1 have one).
      EXPECT_EQ(s.grad_base(), nullptr);
      ASSERT_OK_AND_ASSIGN(void* base, s.ParamBase());
      EXPECT_EQ(base, s.param_base());
    }
    ASSERT_NO_FATAL_FAILURE(TrainOneStep(*e));
  });
}

TEST_P(MisuseTest, WrongDTypeViewIsAnError) {
  const auto [world, stage] = GetParam();
  testing::RunRanks(world, [&](Communicator& comm, int rank) {
    {  // An f32 engine read as 16-bit.
      auto e = MakeEngine(comm, stage);
      ASSERT_NE(e, nullptr);
      ASSERT_OK_AND_ASSIGN(UnitScope s, e->Backward(e->FindUnit("block.0")));
      const auto f32 =
          AllOf(HasSubstr("block.0.w"), HasSubstr(OnRank(rank)), HasSubstr("is f32"), HasSubstr("not uint16_t"));
      EXPECT_THAT(s.Param<uint16_t>("w"), StatusIs(kInvalid, AllOf(f32, HasSubstr("parameter block.0.w"))));
      EXPECT_THAT(s.Grad<uint16_t>("w"), StatusIs(kInvalid, AllOf(f32, HasSubstr("gradient block.0.w"))));
      ASSERT_OK_AND_ASSIGN(const TensorView v, s.Param("w"));
      EXPECT_THAT(v.As<uint16_t>(), StatusIs(kInvalid, f32));
      EXPECT_OK(v.As<float>());
    }
    {  // The case: f32 access to a bf16 view (mixed precision).
      auto e = MakeEngine(comm, stage, /*bf16=*/true);
      ASSERT_NE(e, nullptr);
      ASSERT_OK_AND_ASSIGN(UnitScope s, e->Backward(e->FindUnit("head")));
      const auto bf16 =
          AllOf(HasSubstr("head.w"), HasSubstr(OnRank(rank)), HasSubstr("is bf16, not float"), HasSubstr("uint16_t"));
      EXPECT_THAT(s.Param<float>("w"), StatusIs(kInvalid, bf16));
      EXPECT_THAT(s.Grad<const float>("w"), StatusIs(kInvalid, bf16));
      ASSERT_OK_AND_ASSIGN(const TensorView v, s.Param("w"));
      EXPECT_THAT(v.As<float>(), StatusIs(kInvalid, bf16));
      EXPECT_OK(s.Grad<uint16_t>("w"));
    }
  });
}

TEST_P(MisuseTest, ClosedMovedFromAndEmptyScopesAreErrors) {
  const auto [world, stage] = GetParam();
  testing::RunRanks(world, [&](Communicator& comm, int rank) {
    auto e = MakeEngine(comm, stage);
    ASSERT_NE(e, nullptr);
    const UnitId u = e->FindUnit("block.0");
    const auto closed = AllOf(HasSubstr("scope of unit block.0 is closed"), HasSubstr(OnRank(rank)));
    {  // Close() then use.
      ASSERT_OK_AND_ASSIGN(UnitScope s, e->Backward(u));
      ASSERT_OK(s.Close());
      EXPECT_FALSE(s.open());
      EXPECT_THAT(s.Param("w"), StatusIs(kPrecondition, AllOf(closed, HasSubstr("UnitScope::Param(\"w\")"))));
      EXPECT_THAT(s.Grad("w"), StatusIs(kPrecondition, closed));
      EXPECT_THAT(s.ParamBase(), StatusIs(kPrecondition, closed));
      EXPECT_EQ(s.param_base(), nullptr);
      EXPECT_EQ(s.grad_base(), nullptr);
      EXPECT_OK(s.Close());  // closing twice is harmless
    }
    {  // Moved from: the new owner works, the old one is closed.
      ASSERT_OK_AND_ASSIGN(UnitScope s, e->Forward(u));
      UnitScope t = std::move(s);
      EXPECT_THAT(s.Param("w"), StatusIs(kPrecondition, closed));  // NOLINT(bugprone-use-after-move): the point
      EXPECT_OK(t.Param("w"));
    }
    ASSERT_OK(e->Step());  // ends the step of the first backward scope
    {                      // Default-constructed.
      UnitScope d;
      EXPECT_THAT(d.Param("w"), StatusIs(kPrecondition, HasSubstr("default-constructed")));
      EXPECT_THAT(d.GradBase(), StatusIs(kPrecondition, HasSubstr("default-constructed")));
      EXPECT_EQ(d.param_base(), nullptr);
      EXPECT_OK(d.Close());
    }
    ASSERT_NO_FATAL_FAILURE(TrainOneStep(*e));
  });
}

TEST_P(MisuseTest, UnknownUnitIdsAreErrors) {
  const auto [world, stage] = GetParam();
  testing::RunRanks(world, [&](Communicator& comm, int rank) {
    auto e = MakeEngine(comm, stage);
    ASSERT_NE(e, nullptr);
    const UnitId typo = e->FindUnit("block.O");  // a letter O: -1
    ASSERT_EQ(typo, -1);
    const auto no_unit = AllOf(HasSubstr("no unit with id -1"), HasSubstr(OnRank(rank)), HasSubstr("2 registered"));
    EXPECT_THAT(e->Forward(typo), StatusIs(kInvalid, no_unit));
    EXPECT_THAT(e->Backward(7), StatusIs(kInvalid, HasSubstr("no unit with id 7")));
    EXPECT_THAT(e->Param(typo, "w"), StatusIs(kInvalid, no_unit));
    EXPECT_EQ(e->UnitState(typo), "NO_SUCH_UNIT");
    EXPECT_TRUE(e->UnitParams(typo).empty());
    EXPECT_EQ(e->UnitParams(e->FindUnit("head")).size(), 1u);
    ASSERT_NO_FATAL_FAILURE(TrainOneStep(*e));
  });
}

// Stage 3 shards a unit between scopes: reading it outside one is an error naming its state.
TEST(MisuseStage3Test, ParamOfAUnitNotGatheredIsAnError) {
  testing::RunRanks(2, [&](Communicator& comm, int rank) {
    auto e = MakeEngine(comm, 3);
    ASSERT_NE(e, nullptr);
    EXPECT_THAT(e->Param(e->FindUnit("block.0"), "w"),
                StatusIs(kPrecondition, AllOf(HasSubstr("unit block.0 is NOT_AVAILABLE"), HasSubstr(OnRank(rank)))));
    ASSERT_NO_FATAL_FAILURE(TrainOneStep(*e));
  });
}

TEST_P(MisuseTest, GradOfAFrozenUnitIsAnError) {
  const auto [world, stage] = GetParam();
  testing::RunRanks(world, [&](Communicator& comm, int rank) {
    EngineOptions opts;
    opts.param_groups = {{.match = "head.*", .frozen = true}};
    auto e = MakeEngine(comm, stage, /*bf16=*/false, opts);
    ASSERT_NE(e, nullptr);
    ASSERT_OK_AND_ASSIGN(UnitScope s, e->Backward(e->FindUnit("head")));
    const auto frozen = AllOf(HasSubstr("unit head is frozen"), HasSubstr(OnRank(rank)));
    EXPECT_THAT(s.Grad("w"), StatusIs(kPrecondition, frozen));
    EXPECT_THAT(s.GradBase(), StatusIs(kPrecondition, frozen));
    EXPECT_EQ(s.grad_base(), nullptr);
    EXPECT_OK(s.Param("w"));
  });
}

TEST_P(MisuseTest, ParamGroupMatchingNothingIsAnErrorOnTheEngine) {
  const auto [world, stage] = GetParam();
  testing::RunRanks(world, [&](Communicator& comm, int rank) {
    auto e = Engine::Create(MakeConfig(stage), testing::Borrow(comm),
                            {.param_groups = {{.match = "*.b", .weight_decay = 0.0}, {.match = "*.bais|*ln*"}}});
    ASSERT_OK(e);
    ASSERT_OK((*e)->AddUnit("block.0", {{"w", {8, 8}}, {"b", {8}}}));
    ASSERT_OK((*e)->AddUnit("head", {{"w", {8, 4}}}));
    EXPECT_THAT((*e)->Finalize(Init),
                StatusIs(kInvalid,
                         AllOf(HasSubstr("param_groups[1]"), HasSubstr("\"*.bais|*ln*\""),
                               HasSubstr("matches no parameter"), HasSubstr(OnRank(rank)), HasSubstr("\"unit.param\""),
                               HasSubstr(": block.0.w, block.0.b, head.w"), Not(HasSubstr("names in all")))));
  });
}

// Many parameters: the first 20 names and the count.
TEST(MisuseParamGroupTest, ManyNamesAreListedFirstTwentyAndACount) {
  testing::RunRanks(2, [&](Communicator& comm, int rank) {
    auto e = Engine::Create(MakeConfig(1), testing::Borrow(comm), {.param_groups = {{.match = "layer.*"}}});
    ASSERT_OK(e);
    std::vector<ParamSpec> params;
    for (int i = 0; i < 30; ++i) params.push_back({absl::StrCat("p", i), {4}});
    ASSERT_OK((*e)->AddUnit("layers", params));
    EXPECT_THAT(
        (*e)->Finalize(Init),
        StatusIs(kInvalid, AllOf(HasSubstr("\"layer.*\""), HasSubstr(OnRank(rank)), HasSubstr("layers.p19, ..."),
                                 Not(HasSubstr("layers.p20")), HasSubstr("(30 names in all)"))));
  });
}

// ShardedOptimizer: the full names are "<FlatBuffers::name>.<tensor>", which the error says.
TEST(MisuseParamGroupTest, PatternMatchingNothingIsAnErrorOnTheShardedOptimizer) {
  const std::vector<ParamSpec> tensors = {{"wte", {16, 8}}, {"ln_f.b", {8}}};
  const int64_t numel = 16 * 8 + 8;
  testing::RunRanks(2, [&](Communicator& comm, int rank) {
    const int64_t cap = ShardedOptimizer::Capacity(numel, 2);
    std::vector<float> params(cap, 0.5f), grads(cap, 0.0f);
    FlatBuffers flat{.params = params.data(), .grads = grads.data(), .capacity = cap, .tensors = tensors};
    // The unit-style name a trainer might guess, instead of the buffer pair's "flat.ln_f.b".
    auto opt = ShardedOptimizer::Create(MakeConfig(1), testing::Borrow(comm), {flat},
                                        {.param_groups = {{.match = "model.*.b", .weight_decay = 0.0}}});
    EXPECT_THAT(opt, StatusIs(kInvalid, AllOf(HasSubstr("\"model.*.b\""), HasSubstr("matches no parameter"),
                                              HasSubstr(OnRank(rank)), HasSubstr("<FlatBuffers::name>.<tensor>"),
                                              HasSubstr("flat.wte, flat.ln_f.b"))));
    // The right name works.
    ASSERT_OK(ShardedOptimizer::Create(MakeConfig(1), testing::Borrow(comm), {flat},
                                       {.param_groups = {{.match = "flat.*.b", .weight_decay = 0.0}}}));
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, MisuseTest,
                         ::testing::Values(testing::WorldStage{1, 3}, testing::WorldStage{2, 0},
                                           testing::WorldStage{2, 3}, testing::WorldStage{3, 2}),
                         testing::WorldStageName);

}  // namespace
}  // namespace zero
