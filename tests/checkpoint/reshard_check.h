// tests/checkpoint/reshard_check.h — what the checkpoint tests share: a case's config, exact comparisons of two
// runs, and the resharding contract (CheckReshard) that checkpoint_test runs on chosen pairs and
// reshard_matrix_test on every pair of worlds at every stage.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "support/engine_helpers.h"
#include "support/files.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "support/synthetic_trainer.h"
#include "zero/checkpoint.h"
#include "zero/engine.h"

namespace zero {

using testing::Borrow;
using testing::ExpectSameParams;
using testing::ExpectSameSteps;
using testing::SyntheticTrace;
using testing::TrainConfig;

inline std::string MakeTempDir() { return testing::MakeTempDir("zero_ckpt"); }

struct Case {
  const char* name;
  int world;
  int stage;
  DType dtype = DType::kF32;
  int ga = 1;
  bool offload = false;
  bool stochastic = false;
};

inline Config CaseConfig(const Case& c) {
  Config cfg = TrainConfig(c.stage, /*micro=*/1, c.ga);
  cfg.bf16.enabled = c.dtype == DType::kBF16;
  cfg.bf16.stochastic_rounding = c.stochastic;
  cfg.fp16.enabled = c.dtype == DType::kF16;
  cfg.fp16.initial_scale_power = 8;
  if (c.offload) {
    cfg.zero.offload_optimizer.device = OffloadDevice::kCpu;
    // Stage 3: Twin-Flow, so host and device parts both hold state (a ratio below 1 needs stage 3).
    cfg.zero.offload_optimizer.ratio = c.stage == 3 ? 0.5 : 1.0;
    cfg.zero.sub_group_size = 300;
  }
  return cfg;
}

// Values of every parameter and every optimizer state, by name, as an export of the checkpoint holds them.
inline std::string ExportWithState(const std::string& dir, const std::string& out) {
  ExportOptions o;
  o.optimizer_state = true;
  Status s = ExportSafetensors(dir, out, o);
  EXPECT_OK(s);
  return testing::ReadWholeFile(out);
}

struct ReshardCase {
  std::string name;
  int from_world, from_stage, to_world, to_stage;
  DType dtype;
  bool offload_to = false;
};

// Saved at (N, s) after three steps, loaded at (M, t): the loaded engine holds exactly the saved parameters and
// optimizer state (its own save exports byte-identically: the fp32 master and every optimizer state reassembled
// bit for bit), the offline tool writes the same rank files a run at M saves, and one step after the resume equals
// one step of a run started at M from the offline reshard, bit for bit.
inline void CheckReshard(const ReshardCase& c) {
  const std::string dir = MakeTempDir(), again = MakeTempDir(), offline = MakeTempDir();
  std::map<std::string, std::vector<float>> saved;
  testing::RunRanks(c.from_world, [&](Communicator& comm, int rank) {
    Case k{"from", c.from_world, c.from_stage, c.dtype};
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(CaseConfig(k), Borrow(comm)));
    SyntheticTrace t;
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, 3, 1, testing::HostViewIo(), &t));
    ASSERT_OK(e->Save(dir, {.trainer_state = {{"rank", std::to_string(rank)}}}).status());
    if (rank == 0) saved = t.params;
  });
  ASSERT_FALSE(::testing::Test::HasFailure());
  ASSERT_OK(ReshardCheckpoint(dir, "", offline, c.to_world, c.to_stage));
  testing::RunRanks(c.to_world, [&](Communicator& comm, int rank) {
    Case k{"to", c.to_world, c.to_stage, c.dtype, 1, c.offload_to};
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(CaseConfig(k), Borrow(comm)));
    ASSERT_OK_AND_ASSIGN(LoadResult r, e->Load(dir));
    EXPECT_EQ(r.saved_world_size, c.from_world);
    EXPECT_EQ(r.saved_stage, c.from_stage);
    EXPECT_EQ(r.trainer_state.at("rank"), std::to_string(rank < c.from_world ? rank : 0));
    for (const auto& [unit, specs] : testing::SyntheticUnits()) {
      for (const ParamSpec& p : specs) {
        ASSERT_OK_AND_ASSIGN(std::vector<float> v, e->GatherParam(e->FindUnit(unit), p.name));
        const auto& want = saved.at(unit + "." + p.name);
        EXPECT_EQ(0, std::memcmp(v.data(), want.data(), v.size() * 4)) << unit << "." << p.name;
      }
    }
    ASSERT_OK(e->Save(again, {.tag = r.tag}).status());
    SyntheticTrace t;  // and it trains on
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, 1, 1, testing::HostViewIo(), &t, 3));
    EXPECT_EQ(t.steps.back().step, 4);
    EXPECT_TRUE(std::isfinite(t.steps.back().grad_norm));
    // A run started at M from the offline reshard (the same communicators, a fresh engine) takes the same step.
    e.reset();
    ASSERT_OK_AND_ASSIGN(auto fresh, testing::MakeSyntheticEngine(CaseConfig(k), Borrow(comm)));
    ASSERT_OK(fresh->Load(offline).status());
    SyntheticTrace u;
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*fresh, 1, 1, testing::HostViewIo(), &u, 3));
    ExpectSameSteps(t.steps, u.steps);
    ExpectSameParams(t, u);
  });
  ASSERT_FALSE(::testing::Test::HasFailure());
  ASSERT_OK(VerifyCheckpoint(again));
  ASSERT_OK(VerifyCheckpoint(offline));
  const std::string a = ExportWithState(dir, dir + "/export.safetensors");
  const std::string b = ExportWithState(again, again + "/export.safetensors");
  const std::string o = ExportWithState(offline, offline + "/export.safetensors");
  EXPECT_GT(a.size(), 1000u);
  EXPECT_TRUE(a == b) << "the export of the checkpoint re-saved at world " << c.to_world << " differs";
  EXPECT_TRUE(a == o) << "the export of the offline reshard differs";
  // The offline reshard holds the same rank files a run at the target world size saved.
  for (int r = 0; r < c.to_world; ++r) {
    char name[64];
    std::snprintf(name, sizeof(name), "/step-00000003/rank-%05d-of-%05d.bin", r, c.to_world);
    EXPECT_TRUE(testing::ReadWholeFile(again + name) == testing::ReadWholeFile(offline + name)) << name;
  }
}

}  // namespace zero
