// Traffic by host (StepResult::intra_host_bytes / inter_host_bytes, RankEstimate's same two): with 2 ranks per
// host, every step of the synthetic trainer sends what a closed formula of Gloo's algorithms says, rank by rank,
// for stage 3, hybrid sharding and hybrid sharding with qwZ, at worlds 2 and 4; and zero::Estimate predicts the
// same two numbers for every rank. The formula, per unit of shard S (f32 parameters, padded / N over the N ranks
// of the shard group), per step (one forward and one backward scope):
// - each all-gather (Gloo's ring) sends (N - 1) blocks to the next rank of the group: 2 (N - 1) S · 4 bytes, or
//   2 (N - 1) P with qwZ, which quantizes the forward and the backward gather (P: the message, QwzMessageBytes, and
//   the 1-D parameters' elements of a unit with a 2-D one, exact: as many f32 as the fullest shard holds);
// - the gradient reduce-scatter (Gloo's halving-doubling, f32) sends N S / 2 elements to rank XOR 1, then (N = 4)
//   S to rank XOR 2, and S to the bit-reversed rank when that is another (ranks 1 and 2 of 4);
// - hybrid: the replicas' all-reduce (Gloo's ring over R = 2 replicas) sends 2 (R - 1) / R of the shard, 4 S
//   bytes, to the other replica, on the other host;
// - the step's norm (3 floats) and desync check (32 floats) all-reduce over the group with Gloo's ring, all to the
//   previous rank: 12 + 128 bytes at N = 2; at N = 4, 192 bytes for the desync check and, for the norm's 12 bytes
//   in 8 segments of 4 bytes, 16, 12, 20, 24 bytes from ranks 0-3 (the segments of each pass that hold data);
// - check mode's fingerprint all-gather before each op (below).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "shard/internal/plan.h"
#include "support/engine_helpers.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "support/synthetic_trainer.h"
#include "zero/config.h"
#include "zero/engine.h"
#include "zero/estimate.h"

namespace zero {
namespace {

using testing::Borrow;
using testing::TrainConfig;

constexpr int kPerHost = 2;
constexpr int kSteps = 3;
constexpr int64_t kBlock = 64;  // qwZ blocks: several per shard
// The test communicators run in check mode (support.cc): before each op, an all-gather (ring) of its 32-byte
// fingerprint, (N - 1) · 32 bytes to the next rank.
constexpr int64_t kFingerprint = 32;

void Train(int world, const Config& cfg, std::vector<std::vector<StepResult>>* steps) {
  steps->assign(world, {});
  absl::Mutex mu;
  testing::RunRanks(world, [&](Communicator& comm, int rank) {
    EngineOptions o;
    o.local_world_size = kPerHost;
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, Borrow(comm), o));
    testing::SyntheticTrace t;
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, kSteps, 1, testing::HostViewIo(), &t));
    absl::MutexLock lock(&mu);
    (*steps)[rank] = t.steps;
  });
}

// zero::Estimate's bytes inside and across hosts for world rank `rank` of `world` (2 ranks per host, check mode, the
// synthetic trainer's units).
StatusOr<std::array<int64_t, 2>> EstimateHostBytes(const Config& cfg, int world, int rank) {
  EstimateOptions o;
  o.world = world;
  o.rank = rank;
  o.ranks_per_host = kPerHost;
  o.check_order = true;
  ZERO_ASSIGN_OR_RETURN(const RankEstimate e, Estimate(cfg, testing::SyntheticEstimateUnits(), o));
  return std::array<int64_t, 2>{e.intra_host_bytes, e.inter_host_bytes};
}

// Every rank's second step sends inside and across hosts what zero::Estimate says.
void ExpectEngineEqualsEstimate(const Config& cfg, const std::vector<std::vector<StepResult>>& steps) {
  const int world = static_cast<int>(steps.size());
  for (int w = 0; w < world; ++w) {
    ASSERT_OK_AND_ASSIGN(const auto e, EstimateHostBytes(cfg, world, w));
    EXPECT_EQ(steps[w][1].intra_host_bytes, e[0]) << "rank " << w;
    EXPECT_EQ(steps[w][1].inter_host_bytes, e[1]) << "rank " << w;
  }
}

// The closed formula above for world rank w of `world`, shard groups of N consecutive ranks.
std::array<int64_t, 2> Formula(int world, int N, int w, bool qwz) {
  std::array<int64_t, 2> b{0, 0};
  auto to = [&](int peer, int64_t bytes) { b[peer / kPerHost == w / kPerHost ? 0 : 1] += bytes; };
  const int base = w / N * N, g = w % N;
  auto member = [&](int i) { return base + (i + N) % N; };
  for (const auto& [name, specs] : testing::SyntheticUnits()) {
    int64_t n = 0;
    bool shaped = false;
    for (const ParamSpec& p : specs) {
      n += p.numel();
      shaped |= p.shape.size() >= 2;
    }
    const int64_t q = 32 * N, S = (n + q - 1) / q * q / N;
    // qwZ sends the 1-D parameters of a unit that also has a 2-D one exact after the codes, in f32: every message
    // has room for the most any shard holds.
    int64_t most = 0;
    for (int r = 0; r < N && shaped; ++r) {
      int64_t in_shard = 0, at = 0;
      for (const ParamSpec& p : specs) {
        if (p.shape.size() < 2)
          in_shard += std::max<int64_t>(0, std::min(at + p.numel(), (r + 1) * S) - std::max(at, r * S));
        at += p.numel();
      }
      most = std::max(most, in_shard);
    }
    const int64_t gathered = (N - 1) * (qwz ? internal::QwzMessageBytes(S, kBlock) + (most * 4 + 3) / 4 * 4 : S * 4);
    to(member(g + 1), gathered);       // forward gather
    to(member(g + 1), gathered);       // backward gather
    to(member(g ^ 1), N * S / 2 * 4);  // reduce-scatter, step 0
    if (N == 4) {
      to(member(g ^ 2), S * 4);                                 // step 1
      if (g == 1 || g == 2) to(member(g == 1 ? 2 : 1), S * 4);  // distribution to the bit-reversed rank
    }
    if (world > N) to(w < N ? w + N : w - N, 4 * S + kFingerprint);  // the replicas' all-reduce (two replicas)
    to(member(g + 1), 3 * (N - 1) * kFingerprint);                   // the gathers' and reduction's fingerprints
  }
  const int64_t norm = N == 2 ? 12 : std::array<int64_t, 4>{16, 12, 20, 24}[g];
  to(member(g - 1), norm + (N == 2 ? 128 : 192));
  to(member(g + 1), 2 * (N - 1) * kFingerprint);
  return b;
}

struct Case {
  int world;
  bool hybrid, qwz;
};

class HostTrafficTest : public ::testing::TestWithParam<Case> {};

TEST_P(HostTrafficTest, EveryStepSendsTheFormulaAndTheEstimateSaysSo) {
  const auto [world, hybrid, qwz] = GetParam();
  Config cfg = TrainConfig(3, 1);
  if (hybrid) cfg.zero.mics_shard_size = 2;
  if (qwz) {
    cfg.zero.zero_quantized_weights = true;
    cfg.zero.zero_quantized_weights_block_size = kBlock;
  }
  const int N = hybrid ? 2 : world;
  std::vector<std::vector<StepResult>> steps;
  Train(world, cfg, &steps);
  for (int w = 0; w < world; ++w) {
    SCOPED_TRACE(absl::StrCat("rank ", w));
    const std::array<int64_t, 2> want = Formula(world, N, w, qwz);
    ASSERT_EQ(steps[w].size(), static_cast<size_t>(kSteps));
    for (const StepResult& s : steps[w]) {
      EXPECT_EQ(s.intra_host_bytes, want[0]);
      EXPECT_EQ(s.inter_host_bytes, want[1]);
    }
    ASSERT_OK_AND_ASSIGN(const auto e, EstimateHostBytes(cfg, world, w));
    EXPECT_EQ(e[0], want[0]);
    EXPECT_EQ(e[1], want[1]);
  }
  if (world == 2) {
    for (const StepResult& s : steps[0]) EXPECT_EQ(s.inter_host_bytes, 0);  // one host
  }
  if (hybrid) {
    // Only the replicas' all-reduce crosses hosts: 4 S per unit, and its fingerprint.
    int64_t across = 0;
    for (const auto& [name, specs] : testing::SyntheticUnits()) {
      int64_t n = 0;
      for (const ParamSpec& p : specs) n += p.numel();
      across += 4 * ((n + 63) / 64 * 64 / 2) + kFingerprint;
    }
    for (int w = 0; w < world; ++w) EXPECT_EQ(steps[w][1].inter_host_bytes, across) << "rank " << w;
  }
}

// Stages 0-2 (no closed formula here): the engine's count equals zero::Estimate's, rank by rank.
TEST(HostTrafficStagesTest, EngineEqualsEstimate) {
  for (int stage : {0, 1, 2}) {
    SCOPED_TRACE(absl::StrCat("stage ", stage));
    const Config cfg = TrainConfig(stage, 1);
    std::vector<std::vector<StepResult>> steps;
    Train(4, cfg, &steps);
    ExpectEngineEqualsEstimate(cfg, steps);
  }
}

// qgZ (stages 1-3; two hops over 2 hosts of 2 ranks, one hop under hybrid sharding; int8 and int4; whole and in
// quantized chunks under a reduce_bucket_size of 300): the engine's
// count equals zero::Estimate's, rank by rank, and fewer bytes cross hosts than with the exact reduce-scatter.
TEST(HostTrafficQgzTest, EngineEqualsEstimateAndLessCrossesHosts) {
  struct Q {
    int stage, bits;
    bool hybrid;
    int64_t bucket = 0;  // reduce_bucket_size: 300 reduces every unit but the smallest in quantized chunks
  };
  for (const Q q :
       {Q{3, 8, false}, Q{2, 4, false}, Q{1, 8, false}, Q{3, 8, true}, Q{3, 8, false, 300}, Q{2, 4, true, 300}}) {
    SCOPED_TRACE(
        absl::StrCat("stage ", q.stage, " int", q.bits, q.hybrid ? " hybrid" : "", q.bucket > 0 ? " chunked" : ""));
    Config exact = TrainConfig(q.stage, 1);
    if (q.hybrid) exact.zero.mics_shard_size = 2;
    if (q.bucket > 0) exact.zero.reduce_bucket_size = q.bucket;
    Config cfg = exact;
    cfg.zero.zero_quantized_gradients = true;
    cfg.zero.zero_quantized_gradients_bits = q.bits;
    cfg.zero.zero_quantized_gradients_block_size = kBlock;
    std::vector<std::vector<StepResult>> steps, exact_steps;
    Train(4, cfg, &steps);
    Train(4, exact, &exact_steps);
    ExpectEngineEqualsEstimate(cfg, steps);
    for (int w = 0; w < 4 && !q.hybrid; ++w) {
      EXPECT_LT(steps[w][1].inter_host_bytes, exact_steps[w][1].inter_host_bytes) << "rank " << w;
    }
  }
}

// qwZ on units above allgather_bucket_size, gathered in quantized chunks (every unit but the smallest at bucket
// 300), plain and with hybrid sharding: the engine's count equals zero::Estimate's, rank by rank, and fewer bytes cross
// hosts than with the exact chunked gathers.
TEST(HostTrafficQwzTest, ChunkedGathersEngineEqualsEstimate) {
  for (bool hybrid : {false, true}) {
    SCOPED_TRACE(hybrid ? "hybrid" : "stage 3");
    Config exact = TrainConfig(3, 1);
    exact.zero.allgather_bucket_size = 300;
    if (hybrid) exact.zero.mics_shard_size = 2;
    Config cfg = exact;
    cfg.zero.zero_quantized_weights = true;
    cfg.zero.zero_quantized_weights_block_size = kBlock;
    std::vector<std::vector<StepResult>> steps, exact_steps;
    Train(4, cfg, &steps);
    Train(4, exact, &exact_steps);
    ExpectEngineEqualsEstimate(cfg, steps);
    for (int w = 0; w < 4; ++w) {
      EXPECT_LT(steps[w][1].intra_host_bytes + steps[w][1].inter_host_bytes,
                exact_steps[w][1].intra_host_bytes + exact_steps[w][1].inter_host_bytes)
          << "rank " << w;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, HostTrafficTest,
                         ::testing::Values(Case{2, false, false}, Case{4, false, false}, Case{4, true, false},
                                           Case{4, true, true}, Case{2, false, true}),
                         [](const auto& info) {
                           return absl::StrCat("world", info.param.world, info.param.hybrid ? "_hybrid" : "_stage3",
                                               info.param.qwz ? "_qwz" : "");
                         });

}  // namespace
}  // namespace zero
