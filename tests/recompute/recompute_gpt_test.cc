// The tiny GPT trained through TrainRank at world 2 with and without recomputation: at every stage the losses,
// gradient norms and final parameters are bitwise equal (fp32 on the host), stage 3 issues the same gathers
// (the recompute reuses the backward scope's gather), every-k checkpoints only some blocks, and the activation
// bytes are what the policy says: block inputs plus one block's intermediates, checkpoints on the host tier
// with cpu_checkpointing and none on the device tier.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "gpt/model.h"
#include "gpt/train.h"
#include "support/engine_helpers.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "zero/config.h"
#include "zero/recompute.h"

namespace zero {
namespace {

constexpr int kWorld = 2;
constexpr int kSteps = 3;
constexpr int kMicro = 2;  // sequences per rank per micro-step
constexpr int kAccum = 2;  // micro-steps per step: several passes per step
constexpr int kSeq = 16;

Config GptConfig(int stage) { return testing::TrainConfig(stage, kMicro, kAccum); }

std::vector<gpt::TrainResult> Train(const Config& cfg, bool recompute) {
  std::vector<gpt::TrainResult> results(kWorld);
  gpt::TrainOptions opt;
  opt.model = "tiny";
  opt.steps = kSteps;
  opt.seed = 11;
  opt.seq = kSeq;
  opt.local_world_size = kWorld;
  opt.recompute = recompute;
  testing::RunRanks(kWorld, [&](Communicator& comm_ref, int rank) {
    auto r = gpt::TrainRank(cfg, testing::Borrow(comm_ref), opt, {}, /*collect_final_params=*/true);
    ASSERT_OK(r) << "rank " << rank;
    results[rank] = std::move(*r);
  });
  return results;
}

void ExpectBitwiseEqual(const gpt::TrainResult& got, const gpt::TrainResult& want) {
  ASSERT_EQ(got.steps.size(), want.steps.size());
  for (size_t s = 0; s < want.steps.size(); ++s) {
    EXPECT_EQ(std::memcmp(&got.steps[s].loss, &want.steps[s].loss, sizeof(double)), 0)
        << "step " << s << " loss " << got.steps[s].loss << " vs " << want.steps[s].loss;
    EXPECT_EQ(std::memcmp(&got.steps[s].grad_norm, &want.steps[s].grad_norm, sizeof(double)), 0)
        << "step " << s << " grad norm " << got.steps[s].grad_norm << " vs " << want.steps[s].grad_norm;
  }
  ASSERT_EQ(got.final_params.size(), want.final_params.size());
  ASSERT_FALSE(want.final_params.empty());
  size_t differ = 0;
  for (size_t i = 0; i < want.final_params.size(); ++i) {
    differ += std::memcmp(&got.final_params[i], &want.final_params[i], sizeof(float)) != 0;
  }
  EXPECT_EQ(differ, 0u) << "of " << want.final_params.size() << " final parameters";
}

class RecomputeStageTest : public ::testing::TestWithParam<int> {};

TEST_P(RecomputeStageTest, BitwiseEqualToNoRecompute) {
  const int stage = GetParam();
  const Config cfg = GptConfig(stage);
  const auto plain = Train(cfg, false);
  const auto recomputed = Train(cfg, true);
  const gpt::GptConfig mc = gpt::GptConfig::Tiny();
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE(::testing::Message() << "stage " << stage << " rank " << r);
    ExpectBitwiseEqual(recomputed[r], plain[r]);
    EXPECT_EQ(plain[r].recompute.recomputes, 0);
    EXPECT_EQ(recomputed[r].recompute.recomputes, kSteps * kAccum * mc.layers);
    EXPECT_EQ(recomputed[r].recompute.forwards, kSteps * kAccum * mc.layers);
    // The recompute runs inside the block's backward scope: no gather beyond the backward's own.
    EXPECT_EQ(recomputed[r].prefetch_gathers, plain[r].prefetch_gathers);
    EXPECT_EQ(recomputed[r].demand_gathers, plain[r].demand_gathers);
    if (stage == 3) {
      EXPECT_GT(plain[r].prefetch_gathers + plain[r].demand_gathers, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, RecomputeStageTest, ::testing::Values(0, 1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return "Stage" + std::to_string(i.param); });

// Peak activation bytes, exactly: without recomputation every block's saved activations are live after the
// forward; with it only the block inputs (checkpoints) plus, at the top, one block's rebuilt activations with
// its scratch output and backward temporaries — the head's activations are freed before the first block
// backward, so the larger of the two counts.
TEST(RecomputeGptTest, PeakActivationBytes) {
  const gpt::GptConfig mc = gpt::GptConfig::Tiny();
  const size_t S = static_cast<size_t>(kMicro) * kSeq * mc.channels * sizeof(float);  // residual stream
  const size_t A = gpt::BlockActs::Bytes(mc, kMicro, kSeq);
  const size_t H = gpt::HeadActs::Bytes(mc, kMicro, kSeq);
  const size_t Sc = gpt::BlockScratch::Bytes(mc, kMicro, kSeq);
  const size_t L = mc.layers;

  Config cfg = GptConfig(2);
  const gpt::TrainResult plain = Train(cfg, false)[0];
  EXPECT_EQ(plain.recompute.peak_arena_bytes, 2 * S + L * A + std::max(H, Sc));
  EXPECT_EQ(plain.recompute.peak_checkpoint_bytes, 0u);
  EXPECT_EQ(plain.memory.Get(MemTier::kDevice, MemTag::kActivations).peak,
            static_cast<int64_t>(plain.recompute.peak_arena_bytes));

  const gpt::TrainResult every = Train(cfg, true)[0];
  EXPECT_EQ(every.recompute.peak_checkpoint_bytes, L * S);
  EXPECT_EQ(every.recompute.peak_arena_bytes, 2 * S + std::max(H, S + A + Sc));
  EXPECT_EQ(every.recompute.checkpoint_tier, MemTier::kDevice);
  EXPECT_EQ(every.memory.Get(MemTier::kHost, MemTag::kActivations).peak, 0);
  EXPECT_LT(every.memory.Get(MemTier::kDevice, MemTag::kActivations).peak,
            plain.memory.Get(MemTier::kDevice, MemTag::kActivations).peak);

  // cpu_checkpointing: the checkpoints are the host tier's only activations; the device tier has none of them.
  cfg.activation_checkpointing.cpu_checkpointing = true;
  const gpt::TrainResult cpu = Train(cfg, true)[0];
  EXPECT_EQ(cpu.recompute.checkpoint_tier, MemTier::kHost);
  EXPECT_EQ(cpu.memory.Get(MemTier::kHost, MemTag::kActivations).peak, static_cast<int64_t>(L * S));
  EXPECT_EQ(cpu.memory.Get(MemTier::kDevice, MemTag::kActivations).peak,
            static_cast<int64_t>(2 * S + std::max(H, S + A + Sc)));
  ExpectBitwiseEqual(cpu, plain);
}

// number_checkpoints 1 of 2 blocks: every_k = 2, so block 0 is recomputed and block 1 keeps its activations.
TEST(RecomputeGptTest, EveryKthFromConfig) {
  Config cfg = GptConfig(3);
  cfg.activation_checkpointing.number_checkpoints = 1;
  cfg.activation_checkpointing.contiguous_memory_optimization = true;
  const auto plain = Train(GptConfig(3), false);
  const auto k2 = Train(cfg, true);
  const gpt::GptConfig mc = gpt::GptConfig::Tiny();
  const size_t S = static_cast<size_t>(kMicro) * kSeq * mc.channels * sizeof(float);
  for (int r = 0; r < kWorld; ++r) {
    ExpectBitwiseEqual(k2[r], plain[r]);
    EXPECT_EQ(k2[r].recompute.recomputes, kSteps * kAccum);
    EXPECT_EQ(k2[r].recompute.peak_checkpoint_bytes, S);
  }
}

// Mixed precision goes through the same segments: recomputation stays bitwise with bf16 compute at stage 3.
TEST(RecomputeGptTest, Bf16Stage3) {
  Config cfg = GptConfig(3);
  cfg.bf16.enabled = true;
  const auto plain = Train(cfg, false);
  const auto recomputed = Train(cfg, true);
  ExpectBitwiseEqual(recomputed[0], plain[0]);
  ExpectBitwiseEqual(recomputed[1], plain[1]);
}

}  // namespace
}  // namespace zero
