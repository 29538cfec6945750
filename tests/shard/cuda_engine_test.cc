// The CUDA engine (an NCCL communicator; one GPU, so world size 1) against the host engine (Gloo, world size 1)
// on the same units, config and gradients: every stage, fp32/bf16/fp16, accumulation in both modes, stochastic
// rounding, offload (optimizer, parameters, Twin-Flow). Without clipping every step is identical bit for bit
// (the device kernels reproduce the host's arithmetic: tests/cuda); with clipping the coefficient depends on
// the norm, whose device reduction order differs, so parameters agree to a few ulps. Labelled `gpu`: skipped
// where there is no device (CI).
#include <cuda_runtime_api.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "support/device_view_io.h"
#include "support/engine_helpers.h"
#include "support/status_matchers.h"
#include "support/synthetic_trainer.h"
#include "zero/advanced/cuda_kernels.h"
#include "zero/advanced/engine_stats.h"
#include "zero/communicator.h"
#include "zero/dtype.h"
#include "zero/engine.h"
#include "zero/store.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using ::zero::testing::StatusIs;

using testing::TrainConfig;

using testing::SyntheticTrace;

using testing::DeviceViewIo;

struct Case {
  const char* name;
  int stage;
  DType dtype;
  int ga;
  GradAccumulationMode mode;
  bool stochastic;
  double clip;
  int offload = 0;        // 0: none; 1: offload_optimizer; 2: offload_optimizer + offload_param
  double ratio = 1.0;     // offload_optimizer.ratio (Twin-Flow below 1)
  int64_t qwz_block = 0;  // ZeRO++ qwZ with blocks of this many elements (the quantized gathers on the device)
  int qgz_bits = 0;    // ZeRO++ qgZ (blocks of 32, LoCo): the gradient records coded on the device, NCCL's all-to-all
  int64_t bucket = 0;  // allgather_bucket_size and reduce_bucket_size (0: the defaults): 256 puts ZeRO++ in chunks
  bool int8_residuals = false;  // qgZ: LoCo's residuals as int8 blocks (the device's quantize kernels)
};

Config CaseConfig(const Case& c) {
  Config cfg = TrainConfig(c.stage, /*micro=*/1, c.ga, 3e-3, c.clip, c.mode);
  cfg.bf16.enabled = c.dtype == DType::kBF16;
  cfg.bf16.stochastic_rounding = c.stochastic;
  cfg.fp16.enabled = c.dtype == DType::kF16;
  if (c.offload >= 1) {
    cfg.zero.offload_optimizer.device = OffloadDevice::kCpu;
    cfg.zero.offload_optimizer.pin_memory = true;
    cfg.zero.offload_optimizer.ratio = c.ratio;
    cfg.zero.sub_group_size = 300;  // several pipelined tiles per unit
  }
  if (c.offload >= 2) {
    cfg.zero.offload_param.device = OffloadDevice::kCpu;
    cfg.zero.offload_param.pin_memory = true;
  }
  testing::SetQuantized(cfg, c.qwz_block, c.qgz_bits);
  if (c.int8_residuals) cfg.zero.zero_quantized_gradients_error_feedback_dtype = QgzResidualDType::kInt8;
  if (c.bucket > 0) {
    cfg.zero.allgather_bucket_size = c.bucket;
    cfg.zero.reduce_bucket_size = c.bucket;
  }
  return cfg;
}

class CudaEngineTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(CudaEngineTest, MatchesTheHostEngine) {
  const Case& c = GetParam();
  const Config cfg = CaseConfig(c);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Communicator> gloo, Communicator::CreateGloo(Store::Hash(), 0, 1, {}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Communicator> nccl, Communicator::CreateNccl(Store::Hash(), 0, 1, {}));
  ASSERT_OK_AND_ASSIGN(auto host, testing::MakeSyntheticEngine(cfg, gloo));
  ASSERT_OK_AND_ASSIGN(auto dev, testing::MakeSyntheticEngine(cfg, nccl));
  ASSERT_FALSE(host->on_device());
  ASSERT_TRUE(dev->on_device());
  ASSERT_NE(dev->cuda_stream(), nullptr);
  constexpr int kSteps = 5;
  SyntheticTrace th, td;
  ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*host, kSteps, c.ga, testing::HostViewIo(), &th));
  ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*dev, kSteps, c.ga, DeviceViewIo(*dev), &td));
  for (int k = 0; k < kSteps; ++k) {
    SCOPED_TRACE(::testing::Message() << "step " << k);
    EXPECT_EQ(td.steps[k].skipped, th.steps[k].skipped);
    EXPECT_EQ(td.steps[k].loss_scale, th.steps[k].loss_scale);
    EXPECT_NEAR(td.steps[k].grad_norm, th.steps[k].grad_norm, 1e-6 * th.steps[k].grad_norm);
  }
  size_t changed = 0;
  for (const auto& [name, hv] : th.params) {
    const std::vector<float>& dv = td.params.at(name);
    ASSERT_EQ(dv.size(), hv.size()) << name;
    for (size_t i = 0; i < hv.size(); ++i) {
      if (c.clip == 0) {
        ASSERT_EQ(dv[i], hv[i]) << name << "[" << i << "]";
      } else {
        ASSERT_NEAR(dv[i], hv[i], 1e-6f * std::max(1.0f, std::fabs(hv[i]))) << name << "[" << i << "]";
      }
    }
    changed += testing::MovedElements(name, hv);
  }
  EXPECT_GT(changed, 0u);  // training moved the parameters
  if (c.bucket > 0) {      // the device engine really went in chunks, as the host engine did
    const advanced::EngineStats sd = advanced::Stats(*dev), sh = advanced::Stats(*host);
    EXPECT_EQ(sd.qwz_chunk_gathers, sh.qwz_chunk_gathers);
    EXPECT_EQ(sd.qgz_chunk_reductions, sh.qgz_chunk_reductions);
    EXPECT_EQ(sd.qwz_chunk_gathers > 0, c.qwz_block > 0);
    EXPECT_EQ(sd.qgz_chunk_reductions > 0, c.qgz_bits > 0);
  }
  // Steady-state steps allocate no device memory (no cudaMalloc/cudaFree after the pools warmed up).
  EXPECT_EQ(td.device_allocs_after_last, td.device_allocs_after_second);
  // The model state is where the config puts it; steady-state steps allocate nothing more.
  const MemoryReport& r = td.after_last;
  EXPECT_EQ(r.Get(MemTier::kDevice, MemTag::kParams).current > 0, c.offload < 2);
  EXPECT_EQ(r.Get(MemTier::kDevice, MemTag::kOptimizer).current > 0, c.offload == 0 || c.ratio < 1);
  EXPECT_EQ(r.Get(MemTier::kHost, MemTag::kOptimizer).current > 0, c.offload > 0);
  for (MemTag tag : {MemTag::kParams, MemTag::kGrads, MemTag::kOptimizer, MemTag::kMaster}) {
    for (MemTier tier : {MemTier::kHost, MemTier::kDevice}) {  // the same placement as the host engine's
      // The device keeps low-communication mode's full gradients pooled (freeing would synchronize it).
      if (tag == MemTag::kGrads && tier == MemTier::kDevice && c.mode == GradAccumulationMode::kLowCommunication) {
        EXPECT_GT(r.Get(tier, tag).current, th.after_last.Get(tier, tag).current);
        continue;
      }
      EXPECT_EQ(r.Get(tier, tag).current, th.after_last.Get(tier, tag).current)
          << MemTagName(tag) << "@" << MemTierName(tier);
    }
  }
  for (int t = 0; t < static_cast<int>(MemTag::kCount); ++t) {
    EXPECT_EQ(r.Get(MemTier::kDevice, static_cast<MemTag>(t)).peak,
              td.after_second.Get(MemTier::kDevice, static_cast<MemTag>(t)).peak)
        << MemTagName(static_cast<MemTag>(t));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Stages, CudaEngineTest,
    ::testing::Values(
        Case{"s0_f32", 0, DType::kF32, 1, GradAccumulationMode::kLowMemory, false, 0},
        Case{"s1_f32", 1, DType::kF32, 1, GradAccumulationMode::kLowMemory, false, 0},
        Case{"s2_f32", 2, DType::kF32, 1, GradAccumulationMode::kLowMemory, false, 0},
        Case{"s3_f32", 3, DType::kF32, 1, GradAccumulationMode::kLowMemory, false, 0},
        Case{"s0_bf16_ga2", 0, DType::kBF16, 2, GradAccumulationMode::kLowMemory, false, 0},
        Case{"s1_bf16_ga2", 1, DType::kBF16, 2, GradAccumulationMode::kLowMemory, false, 0},
        Case{"s2_bf16", 2, DType::kBF16, 1, GradAccumulationMode::kLowMemory, false, 0},
        Case{"s2_bf16_ga3_lowcomm", 2, DType::kBF16, 3, GradAccumulationMode::kLowCommunication, false, 0},
        Case{"s3_bf16_ga2", 3, DType::kBF16, 2, GradAccumulationMode::kLowMemory, false, 0},
        Case{"s3_bf16_sr", 3, DType::kBF16, 1, GradAccumulationMode::kLowMemory, true, 0},
        Case{"s3_f16", 3, DType::kF16, 1, GradAccumulationMode::kLowMemory, false, 0},
        // fp32: with clipping a 1-ulp difference of the norm may flip a bf16 rounding, which the
        // next step's gradient (0.1 p) would carry past the tolerance.
        Case{"s3_f32_clip", 3, DType::kF32, 1, GradAccumulationMode::kLowMemory, false, 1.0},
        Case{"s1_bf16_offload", 1, DType::kBF16, 1, GradAccumulationMode::kLowMemory, false, 0, 1},
        Case{"s2_f32_offload_ga2", 2, DType::kF32, 2, GradAccumulationMode::kLowMemory, false, 0, 1},
        Case{"s3_bf16_offload", 3, DType::kBF16, 1, GradAccumulationMode::kLowMemory, false, 0, 1},
        Case{"s3_bf16_offload_all", 3, DType::kBF16, 1, GradAccumulationMode::kLowMemory, false, 0, 2},
        Case{"s3_f32_offload_all", 3, DType::kF32, 1, GradAccumulationMode::kLowMemory, false, 0, 2},
        Case{"s3_bf16_twinflow", 3, DType::kBF16, 1, GradAccumulationMode::kLowMemory, false, 0, 1, 0.5},
        Case{"s3_bf16_sr_offload", 3, DType::kBF16, 2, GradAccumulationMode::kLowMemory, true, 0, 1},
        // qwZ: zero::cuda's quantize kernels give the host's bits, so the gathers match exactly.
        Case{"s3_f32_qwz", 3, DType::kF32, 1, GradAccumulationMode::kLowMemory, false, 0, 0, 1.0, 32},
        Case{"s3_bf16_qwz_offload_all", 3, DType::kBF16, 1, GradAccumulationMode::kLowMemory, false, 0, 2, 1.0, 48},
        // qgZ at world 1 (one hop, NCCL's all-to-all to this rank itself): the int8 and int4 kernels and LoCo's
        // step give the host's bits, so the reductions match exactly.
        Case{"s2_f32_qgz", 2, DType::kF32, 1, GradAccumulationMode::kLowMemory, false, 0, 0, 1.0, 0, 8},
        Case{"s3_bf16_qgz4_qwz", 3, DType::kBF16, 2, GradAccumulationMode::kLowMemory, false, 0, 0, 1.0, 32, 4},
        Case{"s3_f16_qgz_offload", 3, DType::kF16, 1, GradAccumulationMode::kLowMemory, false, 0, 1, 1.0, 0, 8},
        // Units above the buckets: qwZ gathered and qgZ reduced in chunks of whole blocks on the device.
        Case{"s3_bf16_qwz_qgz_chunked", 3, DType::kBF16, 1, GradAccumulationMode::kLowMemory, false, 0, 0, 1.0, 32, 8,
             256},
        Case{"s3_f32_qwz_qgz4_offload_chunked", 3, DType::kF32, 2, GradAccumulationMode::kLowMemory, false, 0, 1, 1.0,
             32, 4, 256},
        // LoCo's residuals kept as int8 blocks, whole and in chunks.
        Case{"s3_bf16_qgz_int8_residuals", 3, DType::kBF16, 1, GradAccumulationMode::kLowMemory, false, 0, 0, 1.0, 0, 8,
             0, true},
        Case{"s2_f32_qgz4_int8_residuals_chunked", 2, DType::kF32, 1, GradAccumulationMode::kLowMemory, false, 0, 0,
             1.0, 0, 4, 256, true}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

class CudaEngineRefusesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(CudaEngineRefusesTest, OwnOptimizerIsNamed) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Communicator> nccl, Communicator::CreateNccl(Store::Hash(), 0, 1, {}));
  EngineOptions o;
  struct Own final : ElementwiseOptimizer {
    std::string Name() const override { return "Own"; }
    std::vector<std::string> StateNames() const override { return {}; }
    void Update(const ShardUpdate&) const override {}
  };
  o.optimizer = std::make_shared<Own>();
  auto f = Engine::Create(TrainConfig(3, 1), nccl, o);
  EXPECT_THAT(f, StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("Own")));
}

// The NVMe tiers run on the host engine only: Finalize refuses each on the CUDA engine, naming its key.
TEST_F(CudaEngineRefusesTest, NvmeTiersAreNamed) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Communicator> nccl, Communicator::CreateNccl(Store::Hash(), 0, 1, {}));
  Config params = TrainConfig(3, 1);
  params.zero.offload_param.device = OffloadDevice::kNvme;
  params.zero.offload_param.nvme_path = ::testing::TempDir();
  EXPECT_THAT(testing::MakeSyntheticEngine(params, nccl).status(),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("offload_param.device \"nvme\"")));
  Config optimizer = TrainConfig(3, 1);
  optimizer.zero.offload_optimizer.device = OffloadDevice::kNvme;
  optimizer.zero.offload_optimizer.nvme_path = ::testing::TempDir();
  EXPECT_THAT(testing::MakeSyntheticEngine(optimizer, nccl).status(),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("offload_optimizer.device \"nvme\"")));
}

}  // namespace
}  // namespace zero
