// Parameter groups (EngineOptions::param_groups): per-parameter weight decay and learning-rate scale chosen by
// name, in the Engine and in ShardedOptimizer, and frozen units (a frozen base under small trainable adapters,
// LoRA-style) that hold no gradient, master or optimizer state and never move.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "support/engine_helpers.h"
#include "support/multi_rank.h"
#include "support/world_stage.h"
#include "zero/engine.h"
#include "zero/sharded_optimizer.h"

namespace zero {
namespace {

float InitValue(const std::string& unit, const std::string& param, int64_t i) {
  return 0.5f + 0.25f * std::sin(0.7f * static_cast<float>(i) + static_cast<float>(unit.size() * 3 + param.size()));
}

// The value a bf16 parameter holds for `x` (round to nearest even), widened back to f32.
float RoundToBf16(float x) {
  uint16_t b;
  float y;
  ConvertBuffer(&x, DType::kF32, &b, DType::kBF16, 1);
  ConvertBuffer(&b, DType::kBF16, &y, DType::kF32, 1);
  return y;
}

void Init(const std::string& unit, const ParamSpec& p, float* v) {
  for (int64_t i = 0; i < p.numel(); ++i) v[i] = InitValue(unit, p.name, i);
}

Config AdamWConfig(int stage, double lr, double wd) {
  Config c = testing::TrainConfig(stage, 1, 1, lr, /*clip=*/0.0);
  c.optimizer->weight_decay = wd;
  c.zero.overlap_comm = false;
  return c;
}

const std::vector<std::pair<std::string, std::vector<ParamSpec>>> kLayers = {
    {"l0", {{"w", {8, 16}}, {"b", {16}}, {"ln_w", {16}}}},
    {"l1", {{"w", {16, 8}}, {"b", {8}}, {"ln_w", {8}}}},
};

// Steps with zero gradients: AdamW's update is then the decay alone, p <- p * (1 - lr * wd) in f32, so a
// parameter without decay stays bitwise where it was.
void ZeroGradSteps(Engine& e, int steps) {
  for (int k = 0; k < steps; ++k) {
    for (UnitId id = 0; id < static_cast<UnitId>(kLayers.size()); ++id) {
      ASSERT_OK_AND_ASSIGN(UnitScope s, e.Backward(id));  // the trainer writes no gradient
    }
    ASSERT_OK(e.Step());
  }
}

using Case = testing::WorldStage;

class NoDecayGroupTest : public ::testing::TestWithParam<Case> {};

TEST_P(NoDecayGroupTest, BiasesAndNormWeightsAreNotDecayed) {
  const auto [world, stage] = GetParam();
  const double lr = 0.1, wd = 0.1;
  const float decay = static_cast<float>(1.0 - lr * wd);
  for (bool grouped : {true, false}) {
    testing::RunRanks(world, [&](Communicator& comm, int) {
      EngineOptions opts;
      if (grouped) opts.param_groups = {{.match = "*.b|*ln_*", .weight_decay = 0.0}};  // the one line
      ASSERT_OK_AND_ASSIGN(auto e, Engine::Create(AdamWConfig(stage, lr, wd), testing::Borrow(comm), opts));
      for (const auto& [name, specs] : kLayers) ASSERT_OK(e->AddUnit(name, specs));
      ASSERT_OK(e->Finalize(Init));
      ZeroGradSteps(*e, 3);
      for (UnitId id = 0; id < static_cast<UnitId>(kLayers.size()); ++id) {
        for (const ParamSpec& p : kLayers[id].second) {
          ASSERT_OK_AND_ASSIGN(std::vector<float> got, e->GatherParam(id, p.name));
          size_t moved = 0;
          for (int64_t i = 0; i < p.numel(); ++i) {
            const float init = InitValue(kLayers[id].first, p.name, i);
            const float decayed = init * decay * decay * decay;
            const bool no_decay = grouped && p.name != "w";
            if (no_decay) {
              ASSERT_EQ(got[i], init) << kLayers[id].first << "." << p.name << "[" << i << "]";
            } else {
              ASSERT_EQ(got[i], decayed) << kLayers[id].first << "." << p.name << "[" << i << "]";
            }
            moved += got[i] != init;
          }
          // The control run (no group) decays every parameter: the check above can fail.
          if (!grouped || p.name == "w") {
            EXPECT_EQ(moved, static_cast<size_t>(p.numel()));
          }
        }
      }
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, NoDecayGroupTest,
                         ::testing::Values(Case{1, 0}, Case{2, 1}, Case{2, 2}, Case{2, 3}, Case{3, 3}),
                         testing::WorldStageName);

// A group's lr_scale multiplies the step's learning rate: 0 leaves its parameters (and, with AdamW, the decay
// 1 - 0 * wd) exactly where they were, while the others train.
TEST(ParamGroupsTest, LrScaleZeroHoldsTheGroup) {
  testing::RunRanks(2, [&](Communicator& comm, int rank) {
    EngineOptions opts;
    opts.param_groups = {{.match = "l1.*", .lr_scale = 0.0}};
    ASSERT_OK_AND_ASSIGN(auto e, Engine::Create(AdamWConfig(2, 0.05, 0.01), testing::Borrow(comm), opts));
    for (const auto& [name, specs] : kLayers) ASSERT_OK(e->AddUnit(name, specs));
    ASSERT_OK(e->Finalize(Init));
    for (int k = 0; k < 3; ++k) {
      for (UnitId id = 0; id < 2; ++id) {
        ASSERT_OK_AND_ASSIGN(UnitScope s, e->Backward(id));
        for (const ParamSpec& p : kLayers[id].second) {
          ASSERT_OK_AND_ASSIGN(float* g, s.Grad<float>(p.name));
          for (int64_t i = 0; i < p.numel(); ++i) g[i] = 0.01f * static_cast<float>((i + rank) % 7) - 0.03f;
        }
      }
      ASSERT_OK(e->Step());
    }
    for (UnitId id = 0; id < 2; ++id) {
      for (const ParamSpec& p : kLayers[id].second) {
        ASSERT_OK_AND_ASSIGN(std::vector<float> got, e->GatherParam(id, p.name));
        size_t moved = 0;
        for (int64_t i = 0; i < p.numel(); ++i) moved += got[i] != InitValue(kLayers[id].first, p.name, i);
        if (id == 1) {
          EXPECT_EQ(moved, 0u) << "l1." << p.name;
        } else {
          EXPECT_GT(moved, 0u) << "l0." << p.name;
        }
      }
    }
  });
}

// LoRA-style: a frozen base of 95 % of the parameters and small trainable adapters. Optimizer state (and, in
// 16-bit, the master; and the gradients) exist for the adapters alone, the base never moves, and its Backward
// scopes still gather it at stage 3.
struct LoraCase {
  int stage;
  bool bf16;
};

class LoraTest : public ::testing::TestWithParam<LoraCase> {};

TEST_P(LoraTest, FrozenBaseHoldsNoStateAndNeverMoves) {
  const auto [stage, bf16] = GetParam();
  const int world = 2;
  std::vector<std::pair<std::string, std::vector<ParamSpec>>> units;
  int64_t base = 0, adapters_padded = 0;
  for (int l = 0; l < 3; ++l) {
    units.push_back({absl::StrCat("base", l), {{"w", {64, 40}}}});                   // 2560
    units.push_back({absl::StrCat("adapter", l), {{"a", {64, 2}}, {"b", {2, 3}}}});  // 134
    base += 2560;
    adapters_padded += (134 + 32 * world - 1) / (32 * world) * (32 * world);
  }
  const int64_t trainable = 3 * 134;
  ASSERT_GE(static_cast<double>(base) / static_cast<double>(base + trainable), 0.95);
  testing::RunRanks(world, [&](Communicator& comm, int rank) {
    Config cfg = AdamWConfig(stage, 0.01, 0.01);
    cfg.bf16.enabled = bf16;
    EngineOptions opts;
    opts.param_groups = {{.match = "base*", .frozen = true}};
    ASSERT_OK_AND_ASSIGN(auto e, Engine::Create(cfg, testing::Borrow(comm), opts));
    for (const auto& [name, specs] : units) ASSERT_OK(e->AddUnit(name, specs));
    ASSERT_OK(e->Finalize(Init));
    for (int k = 0; k < 3; ++k) {
      for (UnitId id = 0; id < static_cast<UnitId>(units.size()); ++id) {
        ASSERT_OK_AND_ASSIGN(UnitScope s, e->Backward(id));
        ASSERT_OK_AND_ASSIGN(const TensorView w, s.Param(units[id].second[0].name));
        EXPECT_NE(w.data, nullptr);                           // gathered, frozen or not
        if (units[id].first.rfind("base", 0) == 0) continue;  // no gradient to write
        for (const ParamSpec& p : units[id].second) {
          ASSERT_OK_AND_ASSIGN(const TensorView g, s.Grad(p.name));
          for (int64_t i = 0; i < p.numel(); ++i) {
            StoreFromF32(g.data, g.dtype, i, 0.02f * static_cast<float>((i + rank + k) % 5) - 0.04f);
          }
        }
      }
      ASSERT_OK(e->Step());
    }
    for (UnitId id = 0; id < static_cast<UnitId>(units.size()); ++id) {
      const bool frozen = units[id].first.rfind("base", 0) == 0;
      for (const ParamSpec& p : units[id].second) {
        ASSERT_OK_AND_ASSIGN(std::vector<float> got, e->GatherParam(id, p.name));
        size_t moved = 0;
        for (int64_t i = 0; i < p.numel(); ++i) {
          const float init = InitValue(units[id].first, p.name, i);
          // bf16 parameters hold the rounded initial value; GatherParam widens it for a frozen unit.
          const float want = bf16 ? RoundToBf16(init) : init;
          if (frozen) {
            ASSERT_EQ(got[i], want) << units[id].first << "." << p.name << "[" << i << "]";
          }
          moved += got[i] != init;
        }
        if (!frozen) {
          EXPECT_GT(moved, 0u) << units[id].first << "." << p.name;
        }
      }
    }
    // Optimizer state: Adam's 8 bytes per element, for the adapters alone (this rank's shard of each from stage
    // 1 on); the fp32 master likewise in bf16; no gradient buffer for the base.
    const MemoryReport m = e->memory_report();
    const int64_t per_rank = stage == 0 ? adapters_padded : adapters_padded / world;
    EXPECT_EQ(m.Get(MemTier::kDevice, MemTag::kOptimizer).current, 8 * per_rank);
    EXPECT_EQ(m.Get(MemTier::kDevice, MemTag::kMaster).current, bf16 ? 4 * per_rank : 0);
    const int64_t cds = bf16 ? 2 : 4;
    int64_t grads = 0;  // the adapters' gradients, per the stage (docs/internals/design.md's table)
    if (stage <= 1) grads += cds * adapters_padded;
    if (stage >= 2) grads += cds * adapters_padded / world;
    EXPECT_EQ(m.Get(MemTier::kDevice, MemTag::kGrads).current, grads);
  });
}

INSTANTIATE_TEST_SUITE_P(Stages, LoraTest,
                         ::testing::Values(LoraCase{0, false}, LoraCase{1, false}, LoraCase{2, false},
                                           LoraCase{3, false}, LoraCase{1, true}, LoraCase{3, true}),
                         [](const ::testing::TestParamInfo<LoraCase>& i) {
                           return absl::StrCat("stage", i.param.stage, i.param.bf16 ? "_bf16" : "_fp32");
                         });

TEST(ParamGroupsTest, AUnitMixingFrozenAndTrainableParametersIsAnError) {
  testing::RunRanks(2, [&](Communicator& comm, int) {
    EngineOptions opts;
    opts.param_groups = {{.match = "l0.w", .frozen = true}};
    ASSERT_OK_AND_ASSIGN(auto e, Engine::Create(AdamWConfig(1, 0.01, 0.0), testing::Borrow(comm), opts));
    for (const auto& [name, specs] : kLayers) ASSERT_OK(e->AddUnit(name, specs));
    EXPECT_THAT(e->Finalize(Init),
                testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                  ::testing::HasSubstr("unit l0 mixes frozen parameter w with trainable parameter b")));
  });
}

// A trainer's own ElementwiseOptimizer is told where each tile lies: its unit, its group and the unit-wide index of
// its first element. Every call stays inside one group, and a step's calls cover this rank's range exactly once —
// on the compute tier and on the offloaded host part alike.
class RecordingSgd : public ElementwiseOptimizer {
 public:
  struct Call {
    int unit, group;
    int64_t first, n;
  };
  std::string Name() const override { return "recording-sgd"; }
  std::vector<std::string> StateNames() const override { return {}; }
  void Update(const ShardUpdate& u) const override {
    for (size_t i = 0; i < u.n; ++i) u.master[i] -= static_cast<float>(u.lr) * LoadAsF32(u.grad, u.grad_dtype, i);
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back({u.unit, u.group, u.first_element, static_cast<int64_t>(u.n)});
  }
  std::vector<Call> Take() const {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(calls_, {});
  }

 private:
  mutable std::mutex mu_;
  mutable std::vector<Call> calls_;
};

TEST(ParamGroupsTest, APlugInOptimizerIsToldEachTilesUnitGroupAndOffset) {
  const int world = 2;
  for (bool offload : {false, true}) {
    testing::RunRanks(world, [&](Communicator& comm, int rank) {
      Config cfg = AdamWConfig(2, 0.01, 0.0);
      if (offload) {
        cfg.zero.offload_optimizer.device = OffloadDevice::kCpu;
        cfg.zero.offload_optimizer.ratio = 0.5;  // Twin-Flow: half of each shard on the host, half in the compute tier
        cfg.zero.stage = 3;
      }
      auto opt = std::make_shared<RecordingSgd>();
      EngineOptions opts;
      opts.optimizer = opt;
      opts.param_groups = {{.match = "*.b", .lr_scale = 0.5}, {.match = "*ln_*", .lr_scale = 2.0}};
      ASSERT_OK_AND_ASSIGN(auto e, Engine::Create(cfg, testing::Borrow(comm), opts));
      for (const auto& [name, specs] : kLayers) ASSERT_OK(e->AddUnit(name, specs));
      ASSERT_OK(e->Finalize(Init));
      ZeroGradSteps(*e, 1);
      const std::vector<RecordingSgd::Call> calls = opt->Take();
      for (UnitId id = 0; id < static_cast<UnitId>(kLayers.size()); ++id) {
        // Each element's group, and this rank's range of the padded unit.
        std::vector<int> group;
        for (const ParamSpec& p : kLayers[id].second) {
          const int g = p.name == "b" ? 0 : p.name == "ln_w" ? 1 : -1;
          group.insert(group.end(), p.numel(), g);
        }
        const int64_t q = 32 * world, padded = (static_cast<int64_t>(group.size()) + q - 1) / q * q;
        const int64_t shard = padded / world, lo = rank * shard, hi = lo + shard;
        std::vector<int> covered(padded, 0);
        for (const auto& c : calls) {
          if (c.unit != id) continue;
          for (int64_t j = c.first; j < c.first + c.n; ++j) {
            ASSERT_GE(j, lo);
            ASSERT_LT(j, hi);
            ++covered[j];
            ASSERT_EQ(c.group, j < static_cast<int64_t>(group.size()) ? group[j] : -1)
                << "unit " << id << " element " << j << (offload ? " (offloaded)" : "");
          }
        }
        for (int64_t j = lo; j < hi; ++j) ASSERT_EQ(covered[j], 1) << "unit " << id << " element " << j;
      }
    });
  }
}

// The same groups in the trainer-owned wrapper: no decay on the biases of a flat buffer.
TEST(ParamGroupsTest, ShardedOptimizerHonoursGroups) {
  const std::vector<ParamSpec> tensors = {{"w", {40, 8}}, {"b", {8}}};
  const int64_t numel = 40 * 8 + 8;
  const double lr = 0.1, wd = 0.1;
  const float decay = static_cast<float>(1.0 - lr * wd);
  testing::RunRanks(2, [&](Communicator& comm, int) {
    const int64_t cap = ShardedOptimizer::Capacity(numel, 2);
    std::vector<float> params(cap, 0.0f), grads(cap, 0.0f);
    for (int64_t i = 0; i < numel; ++i) params[i] = InitValue("flat", "x", i);
    EngineOptions opts;
    opts.param_groups = {{.match = "*.b", .weight_decay = 0.0}};
    ASSERT_OK_AND_ASSIGN(
        auto opt,
        ShardedOptimizer::Create(AdamWConfig(1, lr, wd), testing::Borrow(comm),
                                 {FlatBuffers{params.data(), grads.data(), DType::kF32, cap, tensors, "flat"}}, opts));
    for (int k = 0; k < 2; ++k) ASSERT_OK(opt->Step());  // zero gradients
    for (int64_t i = 0; i < numel; ++i) {
      const float init = InitValue("flat", "x", i);
      ASSERT_EQ(params[i], i < 320 ? init * decay * decay : init) << i;
    }
  });
}

}  // namespace
}  // namespace zero
