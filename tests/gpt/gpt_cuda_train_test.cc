// The GPT trained end to end on one GPU (TrainRankCuda: the model on the device, the engine's CUDA tier over
// NCCL) against the same run on the CPU (TrainRank over Gloo): stages 0-3, fp32 and bf16, with and without
// offload. Labelled `gpu`: skipped without a device (CI).
//
// Tolerances: the two runs differ only in the model's arithmetic (cuBLAS vs OpenBLAS summation order, CUDA's
// expf/tanhf, FMA contraction: each op within ~1e-6 relative, tests/gpt/cuda_ops_test.cc); the engines
// themselves agree bit for bit (tests/shard/cuda_engine_test.cc). Over 6 AdamW steps that drift stays far
// below 1e-3 relative in fp32 losses; bf16 rounds the weights after every step, which can amplify a last-bit
// difference into a bf16 ulp (2^-8 relative) for a few weights, so its bound is 1e-2. Loose enough for
// summation order, tight enough that a wrong gradient anywhere (which moves the loss by O(1) within a few
// steps) fails. The gradient norm is held to the same bound: the loss hardly sees a few lost gradients (AdamW's
// first steps move each weight by about lr whatever its gradient's size), the norm does — NCCL's single-rank
// average dropping each block's last 12 gradients (nccl_communicator.cc, ToNccl) moved step 0's norm by 4.4%
// and later steps' by under 1%.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "gpt/train.h"
#include "gpt/train_cuda.h"
#include "support/status_matchers.h"
#include "zero/advanced/cuda_kernels.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/store.h"

namespace zero::gpt {
namespace {

struct Case {
  const char* name;
  int stage;
  bool bf16;
  bool offload;
};

Config CaseConfig(const Case& c) {
  Config cfg = Config::Default();
  cfg.zero.stage = c.stage;
  cfg.zero.stage3_param_persistence_threshold = 0;
  cfg.train_micro_batch_size_per_gpu = 4;
  cfg.gradient_accumulation_steps = 2;
  cfg.train_batch_size.reset();
  cfg.gradient_clipping = 1.0;
  cfg.bf16.enabled = c.bf16;
  OptimizerConfig o;
  o.type = "AdamW";
  o.lr = 3e-3;
  o.weight_decay = 0.01;
  cfg.optimizer = o;
  if (c.offload) {
    cfg.zero.offload_optimizer.device = OffloadDevice::kCpu;
    cfg.zero.offload_optimizer.pin_memory = true;
    if (c.stage == 3) cfg.zero.offload_param.device = OffloadDevice::kCpu;
  }
  return cfg;
}

class GptCudaTrainTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(GptCudaTrainTest, MatchesTheCpuRun) {
  const Case& c = GetParam();
  const Config cfg = CaseConfig(c);
  TrainOptions opt;
  opt.model = "tiny";
  opt.steps = 6;
  auto gloo = Communicator::CreateGloo(Store::Hash(), 0, 1, {});
  ASSERT_OK(gloo);
  auto nccl = Communicator::CreateNccl(Store::Hash(), 0, 1, {});
  ASSERT_OK(nccl);
  auto cpu = TrainRank(cfg, std::move(*gloo), opt);
  ASSERT_OK(cpu);
  auto gpu = TrainRankCuda(cfg, std::move(*nccl), opt);
  ASSERT_OK(gpu);
  ASSERT_EQ(gpu->steps.size(), cpu->steps.size());
  const double tol = c.bf16 ? 1e-2 : 1e-3;
  for (size_t k = 0; k < cpu->steps.size(); ++k) {
    SCOPED_TRACE(::testing::Message() << "step " << k);
    EXPECT_TRUE(std::isfinite(gpu->steps[k].loss));
    EXPECT_NEAR(gpu->steps[k].loss, cpu->steps[k].loss, tol * std::fabs(cpu->steps[k].loss));
    EXPECT_NEAR(gpu->steps[k].grad_norm, cpu->steps[k].grad_norm, tol * cpu->steps[k].grad_norm);
  }
  EXPECT_LT(gpu->steps.back().loss, gpu->steps.front().loss);  // it learns
  // The model state is in the same tiers, with the same bytes, as on the CPU engine.
  for (MemTag tag : {MemTag::kParams, MemTag::kGrads, MemTag::kOptimizer, MemTag::kMaster}) {
    for (MemTier tier : {MemTier::kHost, MemTier::kDevice}) {
      EXPECT_EQ(gpu->memory.Get(tier, tag).current, cpu->memory.Get(tier, tag).current)
          << MemTagName(tag) << "@" << MemTierName(tier);
    }
  }
  EXPECT_EQ(gpu->memory.Get(MemTier::kDevice, MemTag::kOptimizer).current > 0, !c.offload);
}

INSTANTIATE_TEST_SUITE_P(Stages, GptCudaTrainTest,
                         ::testing::Values(Case{"s0_f32", 0, false, false}, Case{"s1_bf16", 1, true, false},
                                           Case{"s2_bf16", 2, true, false}, Case{"s3_f32", 3, false, false},
                                           Case{"s3_bf16", 3, true, false}, Case{"s2_bf16_offload", 2, true, true},
                                           Case{"s3_bf16_offload", 3, true, true}),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace zero::gpt
