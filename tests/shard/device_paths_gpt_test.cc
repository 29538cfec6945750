// The tiny GPT (CPU model) trained through the engine's DEVICE code paths: the Gloo engine's compute tier is
// replaced by the host tier reporting device() == true, every operation done at once. With no asynchrony left,
// any difference from the ordinary host engine is a logic error of the device paths (pools, staging, landing)
// under a real trainer's pattern: a root unit's backward scope held open over the whole micro-step while the
// blocks' scopes open and close inside it.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "gpt/train.h"
#include "shard/internal/compute.h"
#include "support/engine_helpers.h"
#include "support/gpt_run.h"
#include "zero/config.h"

namespace zero {
namespace {

// The host tier, reporting itself as a device (the engine takes its device paths).
class HostAsDevice final : public internal::ComputeTier {
 public:
  explicit HostAsDevice(MemoryTracker* t) : h_(internal::MakeHostCompute(t)) {}
  bool device() const override { return true; }
  CUstream_st* stream() const override { return nullptr; }
  Status status() const override { return h_->status(); }
  Buffer Alloc(MemTag tag, size_t bytes) override { return h_->Alloc(tag, bytes); }
  void Zero(void* p, size_t bytes) override { h_->Zero(p, bytes); }
  void Convert(const void* s, DType sdt, void* d, DType ddt, int64_t n) override { h_->Convert(s, sdt, d, ddt, n); }
  void Land(const void* s, DType sdt, void* d, DType ddt, int64_t n, bool add) override {
    h_->Land(s, sdt, d, ddt, n, add);
  }
  void AddGradStats(const void* g, DType dt, int64_t n) override { h_->AddGradStats(g, dt, n); }
  GradStatsResult TakeGradStatsSync() override { return h_->TakeGradStatsSync(); }
  void Update(const ElementwiseOptimizer& opt, const ShardUpdate& u, int threads, size_t tile) override {
    h_->Update(opt, u, threads, tile);
  }
  void StochasticRound(const float* src, uint16_t* dst, size_t n, uint64_t key, int64_t first) override {
    h_->StochasticRound(src, dst, n, key, first);
  }
  void QuantizeInt8(const void* x, DType dt, int64_t n, int64_t block, int8_t* q, float* scales) override {
    h_->QuantizeInt8(x, dt, n, block, q, scales);
  }
  void DequantizeInt8(const int8_t* q, const float* scales, int64_t n, int64_t block, void* out, DType dt) override {
    h_->DequantizeInt8(q, scales, n, block, out, dt);
  }
  void QuantizeInt4(const float* x, int64_t n, int64_t block, uint8_t* q, float* scales, float* scratch) override {
    h_->QuantizeInt4(x, n, block, q, scales, scratch);
  }
  void DequantizeInt4(const uint8_t* q, const float* scales, int64_t n, int64_t block, float* out) override {
    h_->DequantizeInt4(q, scales, n, block, out);
  }
  void LocoResidual(const float* y, const float* sent, float* e, float beta, int64_t n) override {
    h_->LocoResidual(y, sent, e, beta, n);
  }
  void Divide(const float* src, float* dst, int64_t n, float divisor) override { h_->Divide(src, dst, n, divisor); }
  void CopyToHostSync(void* d, const void* s, size_t bytes) override { h_->CopyToHostSync(d, s, bytes); }
  void CopyFromHostSync(void* d, const void* s, size_t bytes) override { h_->CopyFromHostSync(d, s, bytes); }
  void CopyFromHost(void* d, const void* s, size_t bytes) override { h_->CopyFromHost(d, s, bytes); }
  std::function<void()> LandOnHostTask(const void* s, DType sdt, void* d, DType ddt, int64_t n, bool add) override {
    return h_->LandOnHostTask(s, sdt, d, ddt, n, add);
  }
  void CopyInOnCopyStream(void* d, const void* s, size_t bytes) override { h_->CopyInOnCopyStream(d, s, bytes); }
  Status Join(Work& w) override { return h_->Join(w); }

 private:
  std::unique_ptr<internal::ComputeTier> h_;
};

struct Case {
  const char* name;
  int world, stage, ga;
  bool qwz = false;  // ZeRO++ qwZ (blocks of 64): the quantized gathers through the tier, 1-D parameters exact
  bool bf16 = false;
  int hpz = 1;       // ZeRO++ hpZ's H (every rank on one host): the secondary copy through the tier
  bool qgz = false;  // ZeRO++ qgZ (int8 blocks of 64, LoCo, one hop): the gradient records coded through the tier
};

class DevicePathsGptTest : public ::testing::TestWithParam<Case> {};

TEST_P(DevicePathsGptTest, MatchesTheHostEngineBitForBit) {
  const Case& c = GetParam();
  Config cfg = testing::TrainConfig(c.stage, 2, c.ga, 3e-3, 1.0, GradAccumulationMode::kLowMemory);
  cfg.zero.zero_quantized_weights = c.qwz;
  cfg.zero.zero_quantized_weights_block_size = 64;
  cfg.bf16.enabled = c.bf16;
  cfg.zero.zero_hpz_partition_size = c.hpz;
  cfg.zero.zero_quantized_gradients = c.qgz;
  cfg.zero.zero_quantized_gradients_block_size = 64;
  const gpt::TrainResult host = testing::TrainTinyGpt(c.world, cfg, 3);
  internal::SetGlooEngineComputeForTesting([](MemoryTracker* t) { return std::make_unique<HostAsDevice>(t); });
  const gpt::TrainResult dev = testing::TrainTinyGpt(c.world, cfg, 3);
  internal::SetGlooEngineComputeForTesting({});
  ASSERT_EQ(dev.steps.size(), host.steps.size());
  for (size_t k = 0; k < host.steps.size(); ++k) {
    EXPECT_EQ(dev.steps[k].loss, host.steps[k].loss) << "step " << k;
    EXPECT_EQ(dev.steps[k].grad_norm, host.steps[k].grad_norm) << "step " << k;
  }
  EXPECT_EQ(dev.final_params, host.final_params);
  if (c.qwz || c.qgz) {  // the gathers or the reductions were quantized: the parameters are not the exact run's
    cfg.zero.zero_quantized_weights = false;
    cfg.zero.zero_quantized_gradients = false;
    EXPECT_NE(testing::TrainTinyGpt(c.world, cfg, 3).final_params, host.final_params);
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, DevicePathsGptTest,
                         ::testing::Values(Case{"w1_s0", 1, 0, 2}, Case{"w1_s1", 1, 1, 2}, Case{"w1_s2", 1, 2, 2},
                                           Case{"w1_s3", 1, 3, 2}, Case{"w1_s2_ga1", 1, 2, 1}, Case{"w2_s2", 2, 2, 2},
                                           Case{"w2_s3", 2, 3, 1}, Case{"w2_s3_qwz", 2, 3, 1, true},
                                           Case{"w3_s3_qwz_bf16", 3, 3, 2, true, true},
                                           Case{"w4_s3_hpz", 4, 3, 2, false, false, 2},
                                           Case{"w4_s3_hpz_qwz_bf16", 4, 3, 1, true, true, 2},
                                           Case{"w2_s2_qgz", 2, 2, 2, false, false, 1, true},
                                           Case{"w4_s3_qgz_qwz_hpz_bf16", 4, 3, 1, true, true, 2, true}),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace zero
