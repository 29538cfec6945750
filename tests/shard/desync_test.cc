// Desync detection with the communicator's default options (no per-op fingerprint exchange): ranks that issue
// different collectives — another unit order, a skipped Step, another shape — get an error naming what each
// side issued, within the timeout, never a hang or silently wrong parameters.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "support/engine_helpers.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "zero/engine.h"
#include "zero/sharded_optimizer.h"

namespace zero {
namespace {

using testing::Borrow;
using testing::TrainConfig;

constexpr int kTimeoutS = 2;

testing::RunRanksOptions DefaultCommOptions() {
  testing::RunRanksOptions o;
  o.comm.check_order = false;  // what users run with: the Step-time hash check and the timeout report
  o.comm.timeout = absl::Seconds(kTimeoutS);
  return o;
}

// Two units of the same size: the same ops whatever the order, so only the labels tell the orders apart.
StatusOr<std::unique_ptr<Engine>> TwoUnits(Communicator& comm, int stage) {
  ZERO_ASSIGN_OR_RETURN(auto e, Engine::Create(TrainConfig(stage, 1), Borrow(comm)));
  ZERO_RETURN_IF_ERROR(e->AddUnit("first", {{"w", {64, 16}}}).status());
  ZERO_RETURN_IF_ERROR(e->AddUnit("second", {{"w", {64, 16}}}).status());
  ZERO_RETURN_IF_ERROR(e->Finalize([](const std::string&, const ParamSpec& p, float* v) {
    for (int64_t i = 0; i < p.numel(); ++i) v[i] = 0.01f * static_cast<float>(i % 17);
  }));
  return e;
}

Status Backward(Engine& e, const char* unit) {
  ZERO_ASSIGN_OR_RETURN(UnitScope s, e.Backward(e.FindUnit(unit)));
  ZERO_ASSIGN_OR_RETURN(float* g, s.Grad<float>("w"));
  for (int i = 0; i < 64 * 16; ++i) g[i] = 0.001f * static_cast<float>(i % 7 + e.rank());
  return s.Close();
}

class DesyncTest : public ::testing::TestWithParam<int> {};

// Rank 1 runs backward in the other unit order: same kinds, sizes and counts of ops, so nothing on the wire
// differs, and the reductions would silently swap the units' gradients. Step's hash check fails on every rank,
// naming the labels each issued.
TEST_P(DesyncTest, AnotherUnitOrderIsAnErrorNamingBothSides) {
  const int stage = GetParam();
  testing::RunRanks(
      2,
      [&](Communicator& comm, int rank) {
        ASSERT_OK_AND_ASSIGN(auto e, TwoUnits(comm, stage));
        ASSERT_OK(Backward(*e, rank == 0 ? "second" : "first"));
        ASSERT_OK(Backward(*e, rank == 0 ? "first" : "second"));
        auto r = e->Step();
        ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
        const std::string msg(r.status().message());
        EXPECT_NE(msg.find("issued different collectives"), std::string::npos) << msg;
        EXPECT_NE(msg.find("[gradient reduction of unit second]"), std::string::npos) << msg;
        EXPECT_NE(msg.find("[gradient reduction of unit first]"), std::string::npos) << msg;
        EXPECT_NE(msg.find("rank 1: Step call 1, StepOptions::step unset"), std::string::npos) << msg;
        EXPECT_NE(msg.find("(hash "), std::string::npos) << msg;
      },
      DefaultCommOptions());
}

// Rank 1 skips a Step and goes on to the next backward: the engine refuses that backward at once (the unit's
// accumulation is complete: "call Step()"), and rank 0, left waiting in its Step, fails within the timeout
// (plus the report's bounded wait) with a report naming rank 1 as the one that left, or on rank 1's
// connection closing.
TEST_P(DesyncTest, ASkippedStepIsAnErrorWithinTheTimeout) {
  const int stage = GetParam();
  std::vector<std::string> errors(2);
  std::vector<double> seconds(2);
  testing::RunRanks(
      2,
      [&](Communicator& comm, int rank) {
        ASSERT_OK_AND_ASSIGN(auto e, TwoUnits(comm, stage));
        const auto t0 = std::chrono::steady_clock::now();
        Status s;
        for (int step = 0; step < 3 && s.ok(); ++step) {
          s = Backward(*e, "second");
          if (s.ok()) s = Backward(*e, "first");
          if (s.ok() && !(rank == 1 && step == 0)) s = e->Step().status();
        }
        if (s.ok()) s = e->Step().status();
        seconds[rank] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ASSERT_FALSE(s.ok()) << "rank " << rank << " trained on out of step";
        errors[rank] = std::string(s.message());
      },
      DefaultCommOptions());
  // How long each rank took is printed, not asserted (a loaded machine stretches any bound); the messages show
  // the mismatch was caught by the step's desync check, not by a wait running out.
  for (int r = 0; r < 2; ++r) std::printf("rank %d failed after %.2f s\n", r, seconds[r]);
  EXPECT_NE(errors[1].find("call Step()"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("[Step: desync check]"), std::string::npos) << errors[0];
  // Rank 1's communicator closes once its own barrier wait (min(timeout, 60 s)) ends, which races with rank 0's
  // timeout: rank 0 either times out and reports rank 1 silent, or sees rank 1's connection close.
  const bool reported = errors[0].find("timed out") != std::string::npos &&
                        errors[0].find("rank 1 posted no report") != std::string::npos;
  const bool lost = errors[0].find("a peer was lost") != std::string::npos;
  EXPECT_TRUE(reported || lost) << errors[0];
}

INSTANTIATE_TEST_SUITE_P(Stages, DesyncTest, ::testing::Values(1, 2, 3));

// Another shape: the ranks gather different parameters (another count on the wire). The op fails within the
// timeout with the report naming both ops and their labels.
TEST(DesyncShapeTest, AnotherShapeIsAnErrorNamingBothOps) {
  std::vector<std::string> errors(2);
  testing::RunRanks(
      2,
      [&](Communicator& comm, int rank) {
        ASSERT_OK_AND_ASSIGN(auto e, Engine::Create(TrainConfig(3, 1), Borrow(comm)));
        ASSERT_OK(e->AddUnit("a", {{"w", {100, 10}}, {"b", {10}}}).status());
        ASSERT_OK(e->Finalize(nullptr));
        auto v = e->GatherParam(e->FindUnit("a"), rank == 0 ? "w" : "b");
        // The unit's gather is the same for both; the difference is the label, then the next op.
        Status s = v.status();
        if (s.ok()) s = e->GatherParam(e->FindUnit("a"), rank == 0 ? "w" : "b").status();
        if (s.ok()) {
          // GatherParam of the same unit issues the same all-gather whatever the parameter: the Step's check
          // is what catches it.
          s = e->Step().status();
        }
        ASSERT_FALSE(s.ok());
        errors[rank] = std::string(s.message());
      },
      DefaultCommOptions());
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("GatherParam of parameter w"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("GatherParam of parameter b"), std::string::npos) << errors[r];
  }
}

// ---- The ranks agree or fail loudly (issue 31): the step, the config, the timeout ----

// A rank that skips a whole iteration on ShardedOptimizer: every Step issues the same ops, so the op hash cannot
// tell; the trainer's step number can. Its next Step fails on every rank, naming each rank's step (the old code
// paired rank 1's step 3 with rank 0's step 2 and went on training).
TEST(DesyncStepTest, ASkippedShardedOptimizerStepFailsOnEveryRankNamingTheSteps) {
  std::vector<std::string> errors(2);
  testing::RunRanks(
      2,
      [&](Communicator& comm, int rank) {
        const int64_t cap = ShardedOptimizer::Capacity(96, comm.world_size());
        std::vector<float> params(cap, 0.5f), grads(cap, 0.0f);
        FlatBuffers flat{params.data(), grads.data(), DType::kF32, cap, {{"w", {8, 12}}}, "flat"};
        ASSERT_OK_AND_ASSIGN(auto opt, ShardedOptimizer::Create(TrainConfig(1, 1), Borrow(comm), {flat}));
        Status s;
        int steps = 0;
        for (int step = 0; step < 5 && s.ok(); ++step) {
          if (rank == 1 && step == 2) continue;  // the trainer bug: one iteration skipped on one rank
          for (int64_t i = 0; i < 96; ++i) grads[i] = 0.01f * static_cast<float>((i + step) % 5);
          StepOptions o;
          o.step = step;
          s = opt->Step(o).status();
          if (s.ok()) ++steps;
        }
        EXPECT_EQ(steps, 2) << "rank " << rank << " trained on out of step";
        ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
        errors[rank] = std::string(s.message());
      },
      DefaultCommOptions());
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("the ranks are not at the same step"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("rank 0: Step call 3, StepOptions::step 2"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("rank 1: Step call 3, StepOptions::step 3"), std::string::npos) << errors[r];
  }
}

// The same on the Engine: rank 1 skips a whole iteration (backward and Step), so its ops line up with rank 0's.
TEST_P(DesyncTest, ASkippedIterationFailsOnEveryRankNamingTheSteps) {
  const int stage = GetParam();
  std::vector<std::string> errors(2);
  testing::RunRanks(
      2,
      [&](Communicator& comm, int rank) {
        ASSERT_OK_AND_ASSIGN(auto e, TwoUnits(comm, stage));
        Status s;
        for (int step = 0; step < 4 && s.ok(); ++step) {
          if (rank == 1 && step == 1) continue;
          s = Backward(*e, "second");
          if (s.ok()) s = Backward(*e, "first");
          StepOptions o;
          o.step = step;
          if (s.ok()) s = e->Step(o).status();
        }
        ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
        errors[rank] = std::string(s.message());
      },
      DefaultCommOptions());
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("rank 0: Step call 2, StepOptions::step 1"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("rank 1: Step call 2, StepOptions::step 2"), std::string::npos) << errors[r];
  }
}

// Ranks created with different configs fail at Create, every one of them, naming the first differing key.
TEST(AgreeTest, DifferentConfigsFailAtCreateOnEveryRankNamingTheKey) {
  std::vector<std::string> errors(3);
  testing::RunRanks(
      3,
      [&](Communicator& comm, int rank) {
        Config cfg = TrainConfig(1, 1);
        if (rank == 2) cfg.zero.stage = 2;
        auto e = Engine::Create(cfg, Borrow(comm));
        ASSERT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition) << e.status();
        errors[rank] = std::string(e.status().message());
      },
      DefaultCommOptions());
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[r].find("different configs"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("rank 0 vs rank 2: zero_optimization.stage: 1 vs 2"), std::string::npos) << errors[r];
    EXPECT_EQ(errors[r].find("rank 0 vs rank 1"), std::string::npos) << errors[r];
  }
}

// A field set in code gets the JSON's error from every Create (it was accepted, and trained, before).
TEST(AgreeTest, CreateValidatesFieldsSetInCode) {
  const std::string json_error(Config::FromJsonString(R"({"zero_optimization": {"stage": 7}})").status().message());
  testing::RunRanks(
      2,
      [&](Communicator& comm, int) {
        Config cfg = TrainConfig(1, 1);
        cfg.zero.stage = 7;
        EXPECT_THAT(Engine::Create(cfg, Borrow(comm)).status(),
                    testing::StatusIs(absl::StatusCode::kInvalidArgument, json_error));
        std::vector<float> p(ShardedOptimizer::Capacity(8, 2)), g(p.size());
        FlatBuffers flat{p.data(), g.data(), DType::kF32, static_cast<int64_t>(p.size()), {{"w", {8}}}, "flat"};
        EXPECT_THAT(ShardedOptimizer::Create(cfg, Borrow(comm), {flat}).status(),
                    testing::StatusIs(absl::StatusCode::kInvalidArgument, json_error));
      },
      DefaultCommOptions());
}

// comm_timeout_s has one source of truth: a communicator left at CommOptions' default under a config that sets
// the key is refused (it waited 1800 s where the config said 20); a config left at the default keeps the
// communicator's own timeout; two explicit values that differ are refused; equal ones are fine.
TEST(AgreeTest, TheConfigsCommTimeoutAndTheCommunicatorsMustAgree) {
  struct Case {
    double comm_s, config_s;
    bool ok;
  };
  for (const Case& c : {Case{1800, 20, false}, Case{5, 1800, true}, Case{5, 20, false}, Case{20, 20, true}}) {
    testing::RunRanksOptions o = DefaultCommOptions();
    o.comm.timeout = absl::Seconds(c.comm_s);
    testing::RunRanks(
        2,
        [&](Communicator& comm, int) {
          Config cfg = TrainConfig(1, 1);
          cfg.comm_timeout_s = c.config_s;
          auto e = Engine::Create(cfg, Borrow(comm));
          if (c.ok) {
            EXPECT_OK(e.status());
          } else {
            EXPECT_THAT(e.status(), testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                                      ::testing::HasSubstr("comm_timeout_s: the config sets 20 s")));
            EXPECT_THAT(std::string(e.status().message()),
                        ::testing::HasSubstr("Communicator::FromEnv(backend, config)"));
          }
        },
        o);
  }
}

}  // namespace
}  // namespace zero
