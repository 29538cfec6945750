// A unit larger than allgather_bucket_size / reduce_bucket_size is gathered and reduce-scattered in chunks of at
// most that many elements, each rank keeping its contiguous shard (shard/internal/collective.h). Chunks move data
// and reduce each element over the same ranks with the same Gloo algorithm, whose summation tree for an element
// does not depend on where the element lies in the buffer, so the chunked run must equal the unchunked one bit
// for bit — step results and every final parameter — and a chunked run repeated gives the same bits again. The
// synthetic trainer's units have odd sizes (37x19 + 19, 19x23, 101, 64x33), so the chunks of 200-element buckets
// end short at every world size 2-5; the cases cover stages 1-3, fp32/bf16, micro-step accumulation in both
// modes, offload and a persistent stage-3 unit (refreshed in chunks by the step).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "support/engine_helpers.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "support/synthetic_trainer.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/engine.h"

namespace zero {
namespace {

using testing::Borrow;
using testing::SyntheticTrace;
using testing::TrainConfig;

struct Case {
  const char* name;
  int world;
  int stage;
  DType dtype = DType::kF32;
  int ga = 1;
  GradAccumulationMode mode = GradAccumulationMode::kLowMemory;
  bool offload = false;
  int64_t persistence = 0;  // stage3_param_persistence_threshold
};

Config CaseConfig(const Case& c, int64_t bucket) {
  Config cfg = TrainConfig(c.stage, /*micro=*/1, c.ga, 3e-3, 1.0, c.mode);
  cfg.bf16.enabled = c.dtype == DType::kBF16;
  cfg.zero.stage3_param_persistence_threshold = c.persistence;
  if (c.offload) {
    cfg.zero.offload_optimizer.device = OffloadDevice::kCpu;
    if (c.stage == 3) cfg.zero.offload_param.device = OffloadDevice::kCpu;
  }
  if (bucket > 0) {
    cfg.zero.reduce_bucket_size = bucket;
    cfg.zero.allgather_bucket_size = bucket;
  }
  return cfg;
}

// Trains the synthetic model for `steps` and returns its trace and how many collectives the rank issued meanwhile
// (a barrier's sequence number before and after).
int64_t Train(const Config& cfg, Communicator& comm, int steps, int ga, SyntheticTrace* t) {
  const int64_t before = comm.Barrier().sequence();
  auto e = testing::MakeSyntheticEngine(cfg, Borrow(comm));
  EXPECT_OK(e);
  if (!e.ok()) return 0;
  testing::TrainSynthetic(**e, steps, ga, testing::HostViewIo(), t);
  return comm.Barrier().sequence() - before;
}

void ExpectSameBits(const SyntheticTrace& a, const SyntheticTrace& b, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t k = 0; k < a.steps.size(); ++k) {
    EXPECT_EQ(a.steps[k].grad_norm, b.steps[k].grad_norm) << "step " << k;
    EXPECT_EQ(a.steps[k].skipped, b.steps[k].skipped) << "step " << k;
  }
  ASSERT_EQ(a.params.size(), b.params.size());
  for (const auto& [name, av] : a.params) {
    const std::vector<float>& bv = b.params.at(name);
    ASSERT_EQ(av.size(), bv.size()) << name;
    for (size_t i = 0; i < av.size(); ++i) {
      ASSERT_EQ(std::memcmp(&av[i], &bv[i], 4), 0) << name << "[" << i << "]: " << av[i] << " vs " << bv[i];
    }
  }
}

class ChunkedCollectivesTest : public ::testing::TestWithParam<Case> {};

TEST_P(ChunkedCollectivesTest, BitwiseEqualToOneCollectivePerUnitAndRepeatable) {
  const Case& c = GetParam();
  constexpr int kSteps = 3;
  constexpr int64_t kBucket = 200;  // elements: every unit but "c" is chunked at every world size
  testing::RunRanks(c.world, [&](Communicator& comm, int) {
    SyntheticTrace whole, chunked, again;
    const int64_t ops_whole = Train(CaseConfig(c, 0), comm, kSteps, c.ga, &whole);
    const int64_t ops_chunked = Train(CaseConfig(c, kBucket), comm, kSteps, c.ga, &chunked);
    Train(CaseConfig(c, kBucket), comm, kSteps, c.ga, &again);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    // The chunks really ran: more, smaller collectives.
    EXPECT_GT(ops_chunked, ops_whole);
    ExpectSameBits(chunked, whole, "chunked vs one collective per unit");
    ExpectSameBits(again, chunked, "chunked, run twice");
    size_t moved = 0;
    for (const auto& [name, v] : whole.params) moved += testing::MovedElements(name, v);
    EXPECT_GT(moved, 0u);
  });
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, ChunkedCollectivesTest,
    ::testing::Values(Case{"w2_s1_f32", 2, 1}, Case{"w3_s1_bf16_ga2", 3, 1, DType::kBF16, 2},
                      Case{"w2_s2_f32_ga2", 2, 2, DType::kF32, 2}, Case{"w3_s2_bf16", 3, 2, DType::kBF16},
                      Case{"w4_s2_f32_ga2_lowcomm", 4, 2, DType::kF32, 2, GradAccumulationMode::kLowCommunication},
                      Case{"w5_s2_f32_offload", 5, 2, DType::kF32, 1, GradAccumulationMode::kLowMemory, true},
                      Case{"w4_s3_f32_ga2", 4, 3, DType::kF32, 2}, Case{"w5_s3_bf16", 5, 3, DType::kBF16},
                      Case{"w3_s3_f32_offload", 3, 3, DType::kF32, 1, GradAccumulationMode::kLowMemory, true},
                      Case{"w2_s3_f32_persistent", 2, 3, DType::kF32, 1, GradAccumulationMode::kLowMemory, false,
                           1000}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace zero
