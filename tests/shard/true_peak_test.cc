// The engine's true peak (MemoryReport::peak_total): per tier, the high-water mark of every byte alive at once,
// the engine's own and its communicator's staging together. It lies between the bytes alive now and the sum of
// the per-tag peaks. The engine pools its gathers, buckets and staging, so after the first step those are all
// alive at once and the two are equal (measured for every configuration below); it is strictly below where a
// tag falls before another rises: a trainer's activations against the low-communication mode's full gradients.
// Engines sharing one communicator (one after another or side by side) each get their own.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "support/engine_helpers.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "support/synthetic_trainer.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/engine.h"
#include "zero/memory.h"

namespace zero {
namespace {

using testing::Borrow;
using testing::TrainConfig;

constexpr MemTier kTiers[] = {MemTier::kHost, MemTier::kDevice};

int64_t SumOfTagPeaks(const MemoryReport& r, MemTier tier) {
  int64_t sum = 0;
  for (const MemoryUsage& u : r.usage[static_cast<size_t>(tier)]) sum += u.peak;
  return sum;
}

// What holds for every engine report, whatever the configuration.
void ExpectBetweenCurrentAndSumOfPeaks(const MemoryReport& r, const std::string& what) {
  for (MemTier tier : kTiers) {
    SCOPED_TRACE(absl::StrCat(what, ", ", MemTierName(tier), " tier"));
    EXPECT_GE(r.PeakTotal(tier), r.Current(tier));
    EXPECT_LE(r.PeakTotal(tier), SumOfTagPeaks(r, tier));
    // No tag alone ever held more than everything together.
    for (const MemoryUsage& u : r.usage[static_cast<size_t>(tier)]) EXPECT_LE(u.peak, r.PeakTotal(tier));
  }
}

struct Case {
  int world;
  int stage;
  bool bf16;     // 16-bit compute: the communicator stages f32 copies for 16-bit reductions
  bool offload;  // optimizer and parameters in the host tier
  GradAccumulationMode mode = GradAccumulationMode::kLowMemory;
};

class TruePeakTest : public ::testing::TestWithParam<Case> {};

TEST_P(TruePeakTest, LiesBetweenTheBytesAliveAndTheSumOfTagPeaks) {
  const Case c = GetParam();
  Config cfg = TrainConfig(c.stage, 1, /*ga=*/2, 3e-3, 1.0, c.mode);
  cfg.bf16.enabled = c.bf16;
  if (c.offload) {
    cfg.zero.offload_optimizer.device = OffloadDevice::kCpu;
    if (c.stage == 3) cfg.zero.offload_param.device = OffloadDevice::kCpu;
  }
  testing::RunRanks(c.world, [&](Communicator& comm, int) {
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, Borrow(comm)));
    testing::SyntheticTrace t;
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, /*steps=*/3, /*ga=*/2, testing::HostViewIo(), &t));
    const MemoryReport r = e->memory_report();
    ExpectBetweenCurrentAndSumOfPeaks(r, "after training");
    // The communicator's staging is in the same high-water mark, so it is at least the staging's own.
    const MemoryReport staging = comm.memory_report();
    EXPECT_GE(r.PeakTotal(MemTier::kHost), staging.PeakTotal(MemTier::kHost));
    // ResetPeaks lowers the true peak to what is alive; a step in the steady state raises it again.
    e->memory_tracker().ResetPeaks();
    const MemoryReport reset = e->memory_report();
    EXPECT_EQ(reset.PeakTotal(MemTier::kDevice), reset.Current(MemTier::kDevice));
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, /*steps=*/1, /*ga=*/2, testing::HostViewIo(), &t));
    const MemoryReport again = e->memory_report();
    EXPECT_GE(again.PeakTotal(MemTier::kDevice), reset.PeakTotal(MemTier::kDevice));
    EXPECT_LE(again.PeakTotal(MemTier::kDevice), r.PeakTotal(MemTier::kDevice));
  });
}

INSTANTIATE_TEST_SUITE_P(Configs, TruePeakTest,
                         ::testing::Values(Case{2, 0, false, false}, Case{2, 1, false, false},
                                           Case{2, 2, false, false}, Case{2, 3, false, false},
                                           Case{4, 3, false, false}, Case{2, 2, true, false},
                                           Case{2, 3, true, true},
                                           Case{2, 2, false, false, GradAccumulationMode::kLowCommunication},
                                           Case{2, 3, false, false, GradAccumulationMode::kLowCommunication},
                                           Case{4, 3, false, false, GradAccumulationMode::kLowCommunication}),
                         [](const auto& info) {
                           const Case& c = info.param;
                           return absl::StrCat(
                               "world", c.world, "_stage", c.stage, c.bf16 ? "_bf16" : "", c.offload ? "_offload" : "",
                               c.mode == GradAccumulationMode::kLowCommunication ? "_low_communication" : "");
                         });

// A trainer's activations, counted in the engine's tracker like the GPT's arena: each unit's forward keeps
// `bytes` until that unit's backward has run.
void TrainWithActivations(Engine& e, int steps, int64_t bytes) {
  std::vector<UnitId> ids;
  for (const auto& [name, specs] : testing::SyntheticUnits()) ids.push_back(e.FindUnit(name));
  for (int k = 0; k < steps; ++k) {
    std::vector<Buffer> acts;
    for (UnitId id : ids) {
      ASSERT_OK_AND_ASSIGN(UnitScope f, e.Forward(id));
      acts.push_back(Buffer::Host(&e.memory_tracker(), MemTag::kActivations, bytes, MemTier::kDevice));
    }
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
      ASSERT_OK_AND_ASSIGN(UnitScope b, e.Backward(*it));
      for (const ParamSpec& spec : e.UnitParams(*it)) {
        const TensorView p = b.param(spec.name), g = b.grad(spec.name);
        for (int64_t i = 0; i < g.numel; ++i) {
          static_cast<float*>(g.data)[i] += 0.1f * static_cast<const float*>(p.data)[i];
        }
      }
      acts.pop_back();
    }
    ASSERT_OK(e.Step());
  }
}

// Every buffer the engine allocates is pooled, except the full gradients of the low-communication mode, which
// are freed once reduced: the trainer's activations peak at the end of the forward, the full gradients at the
// end of the backward, when the activations are gone. So the true peak is below the sum of the tags' peaks
// (with the default low-memory mode every pool, the activations included, is alive at once in the steady state
// and the two are equal).
TEST(TruePeakEngineTest, ActivationsAndFullGradientsPeakAtDifferentTimes) {
  testing::RunRanks(2, [&](Communicator& comm, int) {
    const Config cfg = TrainConfig(3, 1, /*ga=*/1, 3e-3, 1.0, GradAccumulationMode::kLowCommunication);
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, Borrow(comm)));
    constexpr int64_t kActBytes = 4096;
    ASSERT_NO_FATAL_FAILURE(TrainWithActivations(*e, 3, kActBytes));
    const MemoryReport r = e->memory_report();
    ExpectBetweenCurrentAndSumOfPeaks(r, "low communication, with activations");
    EXPECT_EQ(r.Get(MemTier::kDevice, MemTag::kActivations).peak, 4 * kActBytes);
    EXPECT_LT(r.PeakTotal(MemTier::kDevice), SumOfTagPeaks(r, MemTier::kDevice));  // measured: 66304 < 71680
  });
}

// A communicator outlives engines and may serve several: each engine counts the communicator's staging into its
// own peak_total while it lives, and nothing of another engine's bytes. A second engine created after the
// first is gone starts from its own bytes; two engines alive side by side each see only their own.
TEST(TruePeakSharedCommTest, EachEngineOverOneCommunicatorHasItsOwnTruePeak) {
  testing::RunRanks(2, [&](Communicator& comm, int) {
    const Config cfg = TrainConfig(3, 1, /*ga=*/2);
    MemoryReport first;
    {
      ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, Borrow(comm)));
      testing::SyntheticTrace t;
      ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, 2, 2, testing::HostViewIo(), &t));
      first = e->memory_report();
      ExpectBetweenCurrentAndSumOfPeaks(first, "first engine");
    }
    // The communicator keeps its staging (and counts on) after the first engine is gone.
    ASSERT_OK_AND_ASSIGN(auto a, testing::MakeSyntheticEngine(cfg, Borrow(comm)));
    ASSERT_OK_AND_ASSIGN(auto b, testing::MakeSyntheticEngine(TrainConfig(1, 1, /*ga=*/2), Borrow(comm)));
    testing::SyntheticTrace ta, tb;
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*a, 2, 2, testing::HostViewIo(), &ta));
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*b, 2, 2, testing::HostViewIo(), &tb));
    const MemoryReport ra = a->memory_report(), rb = b->memory_report();
    ExpectBetweenCurrentAndSumOfPeaks(ra, "engine a, beside b");
    ExpectBetweenCurrentAndSumOfPeaks(rb, "engine b, beside a");
    // The same configuration and steps as the first engine: the same device-tier true peak, b's bytes not in it.
    EXPECT_EQ(ra.PeakTotal(MemTier::kDevice), first.PeakTotal(MemTier::kDevice));
    a.reset();  // a's link ends: b and the communicator carry on
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*b, 1, 2, testing::HostViewIo(), &tb));
    ExpectBetweenCurrentAndSumOfPeaks(b->memory_report(), "engine b, alone");
  });
}

}  // namespace
}  // namespace zero
