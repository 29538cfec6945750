// Ranks agree on parameter values (EngineOptions::initial_value_sync): one rank's initializer differs (a
// forgotten seed), and by default every rank ends with rank 0's values at stages 0-3, worlds 2-4, as threads
// and as processes under zero-run; with kRequireEqual, Finalize and CopyIn fail on every rank naming the
// parameter; with kTrust nothing is checked (and the stage-3 patchwork the default prevents is what you get).
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "support/engine_helpers.h"
#include "support/multi_rank.h"
#include "support/world_stage.h"
#include "zero/engine.h"

namespace zero {
namespace {

// Two units; in "b.w" rank 1 adds 1000 to every value (the 1,024-element parameter), everything else
// agrees.
const std::vector<std::pair<std::string, std::vector<ParamSpec>>> kUnits = {
    {"a", {{"w", {7, 13}}, {"b", {13}}}},
    {"b", {{"w", {32, 32}}}},
};

float Value(const std::string& unit, const std::string& param, int64_t i, int rank) {
  const float base = static_cast<float>((i * 37 + static_cast<int64_t>(unit.size() + param.size())) % 101) * 0.01f;
  return unit == "b" && rank == 1 ? base + 1000.0f : base;
}

Config MakeConfig(int stage) {
  Config c = testing::TrainConfig(stage, 1);
  c.zero.overlap_comm = false;
  return c;
}

using Case = testing::WorldStage;

class InitialValuesTest : public ::testing::TestWithParam<Case> {};

TEST_P(InitialValuesTest, DefaultTakesRankZerosValues) {
  const auto [world, stage] = GetParam();
  testing::RunRanks(world, [&](Communicator& comm, int rank) {
    ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(MakeConfig(stage), testing::Borrow(comm)));
    for (const auto& [name, specs] : kUnits) ASSERT_OK(engine->AddUnit(name, specs));
    ASSERT_OK(engine->Finalize([rank](const std::string& unit, const ParamSpec& p, float* v) {
      for (int64_t i = 0; i < p.numel(); ++i) v[i] = Value(unit, p.name, i, rank);
    }));
    for (size_t u = 0; u < kUnits.size(); ++u) {
      for (const ParamSpec& p : kUnits[u].second) {
        ASSERT_OK_AND_ASSIGN(std::vector<float> got, engine->GatherParam(static_cast<UnitId>(u), p.name));
        ASSERT_EQ(static_cast<int64_t>(got.size()), p.numel());
        for (int64_t i = 0; i < p.numel(); ++i) {
          ASSERT_EQ(got[i], Value(kUnits[u].first, p.name, i, /*rank=*/0))
              << kUnits[u].first << "." << p.name << "[" << i << "]";
        }
      }
    }
    // CopyIn agrees too: rank 1 copies other values in, every rank keeps rank 0's.
    std::vector<float> in(32 * 32);
    for (size_t i = 0; i < in.size(); ++i) in[i] = rank == 1 ? -1.0f : static_cast<float>(i);
    ASSERT_OK(engine->CopyIn(1, "w", in.data()));
    ASSERT_OK_AND_ASSIGN(std::vector<float> got, engine->GatherParam(1, "w"));
    for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(got[i], static_cast<float>(i)) << i;
  });
}

TEST_P(InitialValuesTest, RequireEqualFailsOnEveryRankNamingTheParameter) {
  const auto [world, stage] = GetParam();
  testing::RunRanks(world, [&](Communicator& comm, int rank) {
    EngineOptions opts;
    opts.initial_value_sync = InitialValueSync::kRequireEqual;
    ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(MakeConfig(stage), testing::Borrow(comm), opts));
    for (const auto& [name, specs] : kUnits) ASSERT_OK(engine->AddUnit(name, specs));
    Status s = engine->Finalize([rank](const std::string& unit, const ParamSpec& p, float* v) {
      for (int64_t i = 0; i < p.numel(); ++i) v[i] = Value(unit, p.name, i, rank);
    });
    EXPECT_THAT(
        s, testing::StatusIs(
               absl::StatusCode::kFailedPrecondition,
               ::testing::HasSubstr("Finalize: the values of unit b parameter w differ across ranks: rank 1 holds")));
  });
  // The same for CopyIn after a Finalize that agreed.
  testing::RunRanks(world, [&](Communicator& comm, int rank) {
    EngineOptions opts;
    opts.initial_value_sync = InitialValueSync::kRequireEqual;
    ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(MakeConfig(stage), testing::Borrow(comm), opts));
    for (const auto& [name, specs] : kUnits) ASSERT_OK(engine->AddUnit(name, specs));
    ASSERT_OK(engine->Finalize([](const std::string& unit, const ParamSpec& p, float* v) {
      for (int64_t i = 0; i < p.numel(); ++i) v[i] = Value(unit, p.name, i, 0);
    }));
    std::vector<float> in(7 * 13, rank == world - 1 ? 2.0f : 1.0f);
    Status s = engine->CopyIn(0, "w", in.data());
    EXPECT_THAT(s, testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                     ::testing::HasSubstr(absl::StrCat(
                                         "CopyIn: the values of unit a parameter w differ across ranks: rank ",
                                         world - 1, " holds"))));
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, InitialValuesTest,
                         ::testing::Values(Case{2, 0}, Case{2, 1}, Case{2, 2}, Case{2, 3}, Case{3, 0}, Case{3, 1},
                                           Case{3, 2}, Case{3, 3}, Case{4, 0}, Case{4, 1}, Case{4, 2}, Case{4, 3}),
                         testing::WorldStageName);

// kTrust checks nothing: at stage 3 each rank keeps its shard of what it computed, so the gathered parameter is a
// patchwork of the ranks' values (the hazard the default removes).
TEST(InitialValuesTrust, Stage3KeepsEachRanksShard) {
  testing::RunRanks(2, [&](Communicator& comm, int rank) {
    EngineOptions opts;
    opts.initial_value_sync = InitialValueSync::kTrust;
    ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(MakeConfig(3), testing::Borrow(comm), opts));
    ASSERT_OK(engine->AddUnit("b", {{"w", {32, 32}}}));
    ASSERT_OK(engine->Finalize([rank](const std::string& unit, const ParamSpec& p, float* v) {
      for (int64_t i = 0; i < p.numel(); ++i) v[i] = Value(unit, p.name, i, rank);
    }));
    ASSERT_OK_AND_ASSIGN(std::vector<float> got, engine->GatherParam(0, "w"));
    EXPECT_EQ(got[0], Value("b", "w", 0, 0));        // rank 0's half
    EXPECT_EQ(got[1023], Value("b", "w", 1023, 1));  // rank 1's half
  });
}

#ifdef ZERO_RUN_PATH
// Processes under zero-run: the same agreement, rank 1's initializer offset by 1000.
std::string RunWorkers(int n, int stage, const std::string& sync, int* status) {
  const std::string cmd =
      absl::StrCat(ZERO_RUN_PATH, " -n ", n, " -- ", ZERO_INIT_WORKER, " --stage ", stage, " --sync ", sync, " 2>&1");
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[512];
  while (p != nullptr && std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  *status = p == nullptr ? -1 : ::pclose(p);
  return out;
}

TEST(InitialValuesProcesses, DefaultTakesRankZerosValues) {
  for (int stage : {0, 3}) {
    int status = 0;
    const std::string out = RunWorkers(3, stage, "rank0", &status);
    EXPECT_EQ(status, 0) << out;
    // Every rank gathered rank 0's values 0..1023: one and the same hash, first 0 and last 1023.
    for (int r = 0; r < 3; ++r) EXPECT_NE(out.find(absl::StrCat("rank ", r, ": ok")), std::string::npos) << out;
    EXPECT_EQ(out.find("first 1000"), std::string::npos) << out;
    EXPECT_EQ(out.find("last 2023"), std::string::npos) << out;
    size_t lines = 0;
    for (size_t pos = out.find("first 0 last 1023"); pos != std::string::npos;
         pos = out.find("first 0 last 1023", pos + 1)) {
      ++lines;
    }
    EXPECT_EQ(lines, 3u) << out;
  }
}

TEST(InitialValuesProcesses, RequireEqualFailsOnEveryRank) {
  int status = 0;
  const std::string out = RunWorkers(3, 3, "require", &status);
  EXPECT_NE(status, 0) << out;
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(out.find(absl::StrCat("rank ", r,
                                    ": error: FAILED_PRECONDITION: Finalize: the values of unit layer "
                                    "parameter w differ across ranks: rank 1 holds")),
              std::string::npos)
        << out;
  }
}
#endif  // ZERO_RUN_PATH

}  // namespace
}  // namespace zero
