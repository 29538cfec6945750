// Checkpoints through the Engine: a save at step k and a resume give the run an uninterrupted one gives, bit for
// bit, at every stage, fp32/bf16/fp16, with and without offload, with gradient accumulation; a checkpoint loads
// at other world sizes and stages (4→2, 2→3, 1→4, 3→1, 4→4) with every value intact; saves are refused mid-cycle
// and fail on every rank when one rank fails.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/reshard_check.h"
#include "support/engine_helpers.h"
#include "support/files.h"
#include "support/flat_mlp.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "support/synthetic_trainer.h"
#include "zero/checkpoint.h"
#include "zero/engine.h"
#include "zero/sharded_optimizer.h"

namespace zero {
namespace {

class ResumeTest : public ::testing::TestWithParam<Case> {};

// Six steps straight against three, a save, a fresh engine, a load, and three more: the same run, bit for bit.
TEST_P(ResumeTest, ResumedRunEqualsUninterruptedRun) {
  const Case& c = GetParam();
  const Config cfg = CaseConfig(c);
  const std::string dir = MakeTempDir();
  constexpr int kFirst = 3, kSecond = 3;
  testing::RunRanks(c.world, [&](Communicator& comm, int rank) {
    SyntheticTrace straight, before, after;
    {
      ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, Borrow(comm)));
      ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, kFirst + kSecond, c.ga, testing::HostViewIo(), &straight));
    }
    {
      ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, Borrow(comm)));
      ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, kFirst, c.ga, testing::HostViewIo(), &before));
      ASSERT_OK_AND_ASSIGN(std::string tag, e->Save(dir, {.trainer_state = {{"pos", std::to_string(100 + rank)}}}));
      EXPECT_EQ(tag, "step-00000003");
    }
    {
      ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, Borrow(comm)));
      ASSERT_OK_AND_ASSIGN(LoadResult r, e->Load(dir));
      EXPECT_EQ(r.step, kFirst);
      EXPECT_EQ(e->steps(), kFirst);
      EXPECT_EQ(r.trainer_state.at("pos"), std::to_string(100 + rank));
      ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, kSecond, c.ga, testing::HostViewIo(), &after, kFirst));
    }
    std::vector<StepResult> joined = before.steps;
    joined.insert(joined.end(), after.steps.begin(), after.steps.end());
    ExpectSameSteps(straight.steps, joined);
    ExpectSameParams(straight, after);
    // Training really moved the parameters (the comparison is not between two untouched models).
    EXPECT_GT(testing::MovedElements("a.w", after.params.at("a.w")), 0u);
  });
  if (!HasFailure()) {
    ASSERT_OK(VerifyCheckpoint(dir));
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, ResumeTest,
                         ::testing::Values(Case{"s0_f32", 2, 0}, Case{"s1_f32", 2, 1}, Case{"s2_f32", 3, 2},
                                           Case{"s3_f32", 2, 3}, Case{"s0_bf16_ga2", 2, 0, DType::kBF16, 2},
                                           Case{"s1_bf16", 2, 1, DType::kBF16},
                                           Case{"s2_bf16_ga2", 2, 2, DType::kBF16, 2},
                                           Case{"s3_bf16_sr", 3, 3, DType::kBF16, 1, false, true},
                                           Case{"s2_f16", 2, 2, DType::kF16}, Case{"s3_f16_ga2", 2, 3, DType::kF16, 2},
                                           Case{"s1_f32_offload", 2, 1, DType::kF32, 1, true},
                                           Case{"s2_bf16_offload_ga2", 2, 2, DType::kBF16, 2, true},
                                           Case{"s3_bf16_offload", 2, 3, DType::kBF16, 1, true},
                                           Case{"s3_f32_offload_ga2", 3, 3, DType::kF32, 2, true}),
                         [](const auto& info) { return std::string(info.param.name); });

class ReshardTest : public ::testing::TestWithParam<ReshardCase> {};

// Saved at (N, s) after three steps, loaded at (M, t), with the dtypes and offload varied (reshard_matrix_test runs
// every pair of worlds at every stage in fp32): see CheckReshard.
TEST_P(ReshardTest, LoadsAtAnotherWorldAndStage) { CheckReshard(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Pairs, ReshardTest,
                         ::testing::Values(ReshardCase{"w4s3_to_w2s1", 4, 3, 2, 1, DType::kBF16},
                                           ReshardCase{"w2s0_to_w3s3", 2, 0, 3, 3, DType::kF32},
                                           ReshardCase{"w1s2_to_w4s2_offload", 1, 2, 4, 2, DType::kBF16, true},
                                           ReshardCase{"w3s1_to_w1s0", 3, 1, 1, 0, DType::kF32},
                                           ReshardCase{"w4s3_to_w4s2", 4, 3, 4, 2, DType::kF16}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(CheckpointTest, SaveInsideAnAccumulationCycleIsRefused) {
  const std::string dir = MakeTempDir();
  testing::RunRanks(2, [&](Communicator& comm, int) {
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(TrainConfig(2, 1, /*ga=*/2), Borrow(comm)));
    const UnitId d = e->FindUnit("d");
    { ASSERT_OK(e->Backward(d).status()); }
    auto s = e->Save(dir);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(std::string(s.status().message()).find("gradient-accumulation cycle"), std::string::npos) << s.status();
  });
  EXPECT_FALSE(LatestCheckpointTag(dir).ok());
}

// Rank 1 cannot write its file: every rank's Save fails naming it, and `latest` still names the previous save.
TEST(CheckpointTest, AFailureOnOneRankFailsTheSaveEverywhere) {
  const std::string dir = MakeTempDir();
  testing::RunRanks(2, [&](Communicator& comm, int rank) {
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(TrainConfig(1, 1), Borrow(comm)));
    ASSERT_OK(e->Save(dir, {.tag = "first"}).status());
    if (rank == 1) {
      // A directory where rank 1's file must go: its rename fails.
      ASSERT_EQ(0, ::mkdir((dir + "/second").c_str(), 0755) == 0 || errno == EEXIST ? 0 : -1);
      ::mkdir((dir + "/second/rank-00001-of-00002.bin").c_str(), 0755);
      ::mkdir((dir + "/second/rank-00001-of-00002.bin/x").c_str(), 0755);
    }
    ASSERT_OK(comm.Barrier().Wait());
    auto s = e->Save(dir, {.tag = "second"});
    ASSERT_FALSE(s.ok());
    if (rank == 0) {
      EXPECT_NE(std::string(s.status().message()).find("rank 1"), std::string::npos) << s.status();
    }
    ASSERT_OK(comm.Barrier().Wait());
  });
  ASSERT_OK_AND_ASSIGN(std::string latest, LatestCheckpointTag(dir));
  EXPECT_EQ(latest, "first");
  ASSERT_OK(VerifyCheckpoint(dir));
  const Status v = VerifyCheckpoint(dir, "second");
  EXPECT_FALSE(v.ok());
  EXPECT_NE(std::string(v.message()).find("incomplete"), std::string::npos) << v;
}

TEST(CheckpointTest, ASavedTagIsNeverOverwritten) {
  const std::string dir = MakeTempDir();
  testing::RunRanks(1, [&](Communicator& comm, int) {
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(TrainConfig(0, 1), Borrow(comm)));
    ASSERT_OK(e->Save(dir).status());
    EXPECT_EQ(e->Save(dir).status().code(), absl::StatusCode::kAlreadyExists);
    // A tag is a folder name: not a path, and not "latest" (the file naming the newest checkpoint).
    for (const std::string tag : {"../up", "a/b", "latest"}) {
      const Status s = e->Save(dir, {.tag = tag}).status();
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << tag << ": " << s;
      EXPECT_NE(std::string(s.message()).find("is not a plain folder name"), std::string::npos) << s;
    }
  });
  ASSERT_OK_AND_ASSIGN(std::string latest, LatestCheckpointTag(dir));
  EXPECT_EQ(latest, "step-00000000");
}

TEST(CheckpointTest, LoadChecksTheModel) {
  const std::string dir = MakeTempDir();
  testing::RunRanks(1, [&](Communicator& comm, int) {
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(TrainConfig(1, 1), Borrow(comm)));
    ASSERT_OK(e->Save(dir).status());
    // Another model: a parameter of another shape.
    ASSERT_OK_AND_ASSIGN(auto other, Engine::Create(TrainConfig(1, 1), Borrow(comm)));
    ASSERT_OK(other->AddUnit("a", {{"w", {19, 37}}, {"b", {19}}}).status());
    ASSERT_OK(other->Finalize(nullptr));
    auto r = other->Load(dir, {.strict = false});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(r.status().message()).find("a.w has shape [19,37]"), std::string::npos) << r.status();
    // A subset of the model: strict names what the model lacks; non-strict loads it.
    ASSERT_OK_AND_ASSIGN(auto part, Engine::Create(TrainConfig(1, 1), Borrow(comm)));
    ASSERT_OK(part->AddUnit("c", {{"v", {101}}}).status());
    ASSERT_OK(part->Finalize(nullptr));
    auto strict = part->Load(dir);
    EXPECT_EQ(strict.status().code(), absl::StatusCode::kInvalidArgument);
    ASSERT_OK(part->Load(dir, {.strict = false}).status());
    // Another optimizer: its state is not in the checkpoint.
    Config sgd = TrainConfig(1, 1);
    sgd.optimizer->type = "SGD";
    sgd.optimizer->momentum = 0.9;
    ASSERT_OK_AND_ASSIGN(auto s, testing::MakeSyntheticEngine(sgd, Borrow(comm)));
    auto bad = s->Load(dir);
    EXPECT_NE(std::string(bad.status().message()).find("momentum_buffer"), std::string::npos) << bad.status();
    ASSERT_OK(s->Load(dir, {.load_optimizer_state = false}).status());
    EXPECT_EQ(s->steps(), 0);
  });
}

// A frozen base (unit "a", parameters only) under trainable units, bf16 at stage 3: resumed exactly; and the
// same checkpoint loads into a model where "a" is trainable (its master from the saved 16-bit parameters, its
// optimizer state from zero) and a decay-free group.
TEST(CheckpointTest, FrozenUnitsAndGroupsResumeExactly) {
  const std::string dir = MakeTempDir();
  Config cfg = TrainConfig(3, 1);
  cfg.bf16.enabled = true;
  EngineOptions frozen;
  frozen.param_groups = {{.match = "a.*", .frozen = true}, {.match = "*.b", .weight_decay = 0.0}};
  // TrainSynthetic writes every unit's gradient; a frozen unit hands out none, so train the others directly.
  auto train = [&](Engine& e, int first, int steps, std::vector<double>* norms) {
    for (int k = first; k < first + steps; ++k) {
      for (const char* name : {"b", "c", "d"}) {
        auto s = e.Backward(e.FindUnit(name));
        ASSERT_OK(s);
        for (const ParamSpec& p : e.UnitParams(e.FindUnit(name))) {
          ASSERT_OK_AND_ASSIGN(const TensorView g, s->Grad(p.name));
          ASSERT_OK_AND_ASSIGN(uint16_t * gv, g.As<uint16_t>());
          std::vector<float> f(g.numel);
          for (int64_t i = 0; i < g.numel; ++i) f[i] = 0.01f * std::sin(0.3f * i + k + e.rank());
          ConvertBuffer(f.data(), DType::kF32, gv, DType::kBF16, f.size());
        }
      }
      auto r = e.Step();
      ASSERT_OK(r);
      norms->push_back(r->grad_norm);
    }
  };
  std::vector<float> straight_d, resumed_d;
  cfg.zero.ignore_unused_parameters = true;  // the frozen unit gets no gradient
  testing::RunRanks(2, [&](Communicator& comm, int rank) {
    std::vector<double> n1, n2, n3;
    {
      ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, Borrow(comm), frozen));
      ASSERT_NO_FATAL_FAILURE(train(*e, 0, 4, &n1));
      ASSERT_OK_AND_ASSIGN(auto d, e->GatherParam(e->FindUnit("d"), "w"));
      if (rank == 0) straight_d = d;
    }
    {
      ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, Borrow(comm), frozen));
      ASSERT_NO_FATAL_FAILURE(train(*e, 0, 2, &n2));
      ASSERT_OK(e->Save(dir).status());
    }
    {
      ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, Borrow(comm), frozen));
      ASSERT_OK(e->Load(dir).status());
      ASSERT_NO_FATAL_FAILURE(train(*e, 2, 2, &n3));
      ASSERT_OK_AND_ASSIGN(auto d, e->GatherParam(e->FindUnit("d"), "w"));
      if (rank == 0) resumed_d = d;
    }
    n2.insert(n2.end(), n3.begin(), n3.end());
    EXPECT_EQ(n1, n2);
    // Unfrozen: "a" trains from the saved values.
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, Borrow(comm)));
    ASSERT_OK(e->Load(dir).status());
    ASSERT_OK_AND_ASSIGN(auto a, e->GatherParam(e->FindUnit("a"), "w"));
    for (size_t i = 0; i < a.size(); ++i) {
      // The frozen base never moved: its values are the bf16-rounded initial values.
      uint16_t h;
      float want = testing::SyntheticInit("a", "w", static_cast<int64_t>(i)), back;
      ConvertBuffer(&want, DType::kF32, &h, DType::kBF16, 1);
      ConvertBuffer(&h, DType::kBF16, &back, DType::kF32, 1);
      ASSERT_EQ(a[i], back) << i;
    }
  });
  EXPECT_EQ(straight_d, resumed_d);
  ASSERT_OK_AND_ASSIGN(std::string desc, DescribeCheckpoint(dir));
  EXPECT_NE(desc.find("unit a: 722 elements, frozen [param:bf16]"), std::string::npos) << desc;
  EXPECT_NE(desc.find("group \"*.b\": lr_scale 1, weight_decay 0"), std::string::npos) << desc;
}

// A C-style trainer's ShardedOptimizer checkpoint (one buffer "flat", stage 2, world 2) loads into an Engine
// that cuts the same parameters into other units (through a name map) at world 3 and stage 3, and back into a
// wrapper at world 1: the same values wherever they go.
TEST(CheckpointTest, WrapperAndEngineLoadEachOthersCheckpoints) {
  namespace fm = testing::flat_mlp;
  const std::string dir = MakeTempDir(), dir2 = MakeTempDir();
  std::map<std::string, std::vector<float>> saved;
  Config cfg = TrainConfig(2, 1);
  testing::RunRanks(2, [&](Communicator& comm, int rank) {
    const int64_t cap = ShardedOptimizer::Capacity(fm::kNumel, 2);
    std::vector<float> params(cap, 0.0f), grads(cap, 0.0f);
    fm::InitParams(params.data());
    FlatBuffers flat{params.data(), grads.data(), DType::kF32, cap, fm::kTensors, "flat"};
    ASSERT_OK_AND_ASSIGN(auto opt, ShardedOptimizer::Create(cfg, Borrow(comm), {flat}));
    for (int t = 1; t <= 3; ++t) {
      fm::ForwardBackward(params.data(), grads.data(), t, rank * fm::kBatch / 2, (rank + 1) * fm::kBatch / 2);
      ASSERT_OK(opt->Step().status());
    }
    ASSERT_OK(opt->Save(dir).status());
    for (const ParamSpec& p : fm::kTensors) {
      ASSERT_OK_AND_ASSIGN(auto v, opt->GatherParam(0, p.name));
      if (rank == 0) saved["flat." + p.name] = v;
    }
  });
  ASSERT_FALSE(HasFailure());
  testing::RunRanks(3, [&](Communicator& comm, int) {
    ASSERT_OK_AND_ASSIGN(auto e, Engine::Create(TrainConfig(3, 1), Borrow(comm)));
    const UnitId l1 = e->AddUnit("l1", {fm::kTensors[0], fm::kTensors[1]}).value();
    const UnitId l2 = e->AddUnit("l2", {fm::kTensors[2], fm::kTensors[3]}).value();
    ASSERT_OK(e->Finalize(nullptr));
    LoadOptions lo;
    lo.name_map = {{"l1.w1", "flat.w1"}, {"l1.b1", "flat.b1"}, {"l2.w2", "flat.w2"}, {"l2.b2", "flat.b2"}};
    ASSERT_OK_AND_ASSIGN(LoadResult r, e->Load(dir, lo));
    EXPECT_EQ(r.step, 3);
    for (const auto& [unit, name] :
         std::vector<std::pair<UnitId, std::string>>{{l1, "w1"}, {l1, "b1"}, {l2, "w2"}, {l2, "b2"}}) {
      ASSERT_OK_AND_ASSIGN(auto v, e->GatherParam(unit, name));
      EXPECT_EQ(v, saved.at("flat." + name)) << name;
    }
    ASSERT_OK(e->Save(dir2).status());
  });
  ASSERT_FALSE(HasFailure());
  testing::RunRanks(1, [&](Communicator& comm, int) {
    const int64_t cap = ShardedOptimizer::Capacity(fm::kNumel, 1);
    std::vector<float> params(cap, 0.0f), grads(cap, 0.0f);
    FlatBuffers flat{params.data(), grads.data(), DType::kF32, cap, fm::kTensors, "flat"};
    ASSERT_OK_AND_ASSIGN(auto opt, ShardedOptimizer::Create(TrainConfig(1, 1), Borrow(comm), {flat}));
    LoadOptions lo;
    lo.name_map = {{"flat.w1", "l1.w1"}, {"flat.b1", "l1.b1"}, {"flat.w2", "l2.w2"}, {"flat.b2", "l2.b2"}};
    ASSERT_OK(opt->Load(dir2, lo).status());
    // The trainer's own buffer now holds the values.
    int64_t at = 0;
    for (const ParamSpec& p : fm::kTensors) {
      const auto& want = saved.at("flat." + p.name);
      EXPECT_EQ(0, std::memcmp(params.data() + at, want.data(), want.size() * 4)) << p.name;
      at += p.numel();
    }
  });
}

}  // namespace
}  // namespace zero
