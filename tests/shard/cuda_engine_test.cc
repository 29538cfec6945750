// The CUDA engine (an NCCL communicator; one GPU, so world size 1) against the host engine (Gloo, world size 1)
// on the same units, config and gradients: every stage, fp32/bf16/fp16, accumulation in both modes, stochastic
// rounding, offload (optimizer, parameters, Twin-Flow). Without clipping every step is identical bit for bit
// (the device kernels reproduce the host's arithmetic: tests/cuda); with clipping the coefficient depends on
// the norm, whose device reduction order differs, so parameters agree to a few ulps. Labelled `gpu`: skipped
// where there is no device (CI).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "support/engine_helpers.h"
#include "zero/communicator.h"
#include "zero/cuda_kernels.h"
#include "zero/dtype.h"
#include "zero/engine.h"
#include "zero/store.h"

namespace zero {
namespace {

using testing::TrainConfig;

const std::vector<std::pair<std::string, std::vector<ParamSpec>>>& Units() {
  static const auto* u = new std::vector<std::pair<std::string, std::vector<ParamSpec>>>{
      {"a", {{"w", {37, 19}}, {"b", {19}}}},
      {"b", {{"w", {19, 23}}}},
      {"c", {{"v", {101}}}},
  };
  return *u;
}

float InitValue(const std::string& unit, const std::string& param, int64_t i) {
  const uint64_t h = std::hash<std::string>{}(unit + "/" + param) ^ static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
  return static_cast<float>(static_cast<int64_t>(h % 2001) - 1000) * 1e-4f;
}

// What one rank's training produced: per step (skipped, norm, lr) and every final fp32 parameter.
struct Trace {
  std::vector<StepResult> steps;
  std::map<std::string, std::vector<float>> params;
  MemoryReport after_second, after_last;
  int64_t device_allocs_after_second = 0, device_allocs_after_last = 0;
};

// Copies n elements between a view and host memory (a device view through the engine's stream).
void ViewToHost(const Engine& e, const TensorView& v, std::vector<unsigned char>* out) {
  const size_t bytes = static_cast<size_t>(v.numel) * DTypeSize(v.dtype);
  out->resize(bytes);
  if (!e.on_device()) {
    std::memcpy(out->data(), v.data, bytes);
    return;
  }
  ASSERT_EQ(cudaMemcpyAsync(out->data(), v.data, bytes, cudaMemcpyDeviceToHost, e.cuda_stream()), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(e.cuda_stream()), cudaSuccess);
}
void HostToView(const Engine& e, const std::vector<unsigned char>& in, const TensorView& v) {
  if (!e.on_device()) {
    std::memcpy(v.data, in.data(), in.size());
    return;
  }
  ASSERT_EQ(cudaMemcpyAsync(v.data, in.data(), in.size(), cudaMemcpyHostToDevice, e.cuda_stream()), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(e.cuda_stream()), cudaSuccess);
}

// Trains `steps` steps: in every micro-step each unit's gradient g_i = 0.01 sin(0.37 i + step + 0.5 micro) +
// 0.1 p_i (p the parameter as the view holds it) is ACCUMULATED into the view, in f32 rounded once to the
// compute dtype — the same host arithmetic for both engines, so only the engine differs.
void Train(Engine& e, int steps, int ga, Trace* t) {
  std::vector<UnitId> ids;
  for (const auto& [name, specs] : Units()) ids.push_back(e.FindUnit(name));
  std::vector<unsigned char> pbuf, gbuf;
  for (int k = 0; k < steps; ++k) {
    for (int m = 0; m < ga; ++m) {
      for (UnitId id : ids) {
        auto f = e.Forward(id);
        ASSERT_TRUE(f.ok()) << f.status();
      }
      for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
        auto b = e.Backward(*it);
        ASSERT_TRUE(b.ok()) << b.status();
        for (const ParamSpec& spec : e.UnitParams(*it)) {
          const TensorView pv = b->param(spec.name), gv = b->grad(spec.name);
          ASSERT_NO_FATAL_FAILURE(ViewToHost(e, pv, &pbuf));
          ASSERT_NO_FATAL_FAILURE(ViewToHost(e, gv, &gbuf));
          for (int64_t i = 0; i < gv.numel; ++i) {
            const float g = 0.01f * std::sin(0.37f * static_cast<float>(i) + static_cast<float>(k) + 0.5f * m) +
                            0.1f * LoadAsF32(pbuf.data(), pv.dtype, i);
            StoreFromF32(gbuf.data(), gv.dtype, i, LoadAsF32(gbuf.data(), gv.dtype, i) + g);
          }
          ASSERT_NO_FATAL_FAILURE(HostToView(e, gbuf, gv));
        }
      }
    }
    auto r = e.Step();
    ASSERT_TRUE(r.ok()) << r.status();
    t->steps.push_back(*r);
    if (k == 1) {
      t->after_second = e.memory_report();
      t->device_allocs_after_second = e.memory_tracker().allocations(MemTier::kDevice);
    }
  }
  t->after_last = e.memory_report();
  t->device_allocs_after_last = e.memory_tracker().allocations(MemTier::kDevice);
  for (size_t u = 0; u < ids.size(); ++u) {
    for (const ParamSpec& spec : e.UnitParams(ids[u])) {
      auto v = e.GatherParam(ids[u], spec.name);
      ASSERT_TRUE(v.ok()) << v.status();
      t->params[Units()[u].first + "." + spec.name] = *v;
    }
  }
}

StatusOr<std::unique_ptr<Engine>> MakeEngine(const Config& cfg, std::shared_ptr<Communicator> comm) {
  ZERO_ASSIGN_OR_RETURN(auto e, Engine::Create(cfg, std::move(comm)));
  for (const auto& [name, specs] : Units()) ZERO_RETURN_IF_ERROR(e->AddUnit(name, specs).status());
  ZERO_RETURN_IF_ERROR(e->Finalize([](const std::string& unit, const ParamSpec& p, float* out) {
    for (int64_t i = 0; i < p.numel(); ++i) out[i] = InitValue(unit, p.name, i);
  }));
  return e;
}

struct Case {
  const char* name;
  int stage;
  DType dtype;
  int ga;
  GradAccumulationMode mode;
  bool stochastic;
  double clip;
  int offload = 0;      // 0: none; 1: offload_optimizer; 2: offload_optimizer + offload_param
  double ratio = 1.0;   // offload_optimizer.ratio (Twin-Flow below 1)
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
  ASSERT_OK_AND_ASSIGN(auto host, MakeEngine(cfg, gloo));
  ASSERT_OK_AND_ASSIGN(auto dev, MakeEngine(cfg, nccl));
  ASSERT_FALSE(host->on_device());
  ASSERT_TRUE(dev->on_device());
  ASSERT_NE(dev->cuda_stream(), nullptr);
  constexpr int kSteps = 5;
  Trace th, td;
  ASSERT_NO_FATAL_FAILURE(Train(*host, kSteps, c.ga, &th));
  ASSERT_NO_FATAL_FAILURE(Train(*dev, kSteps, c.ga, &td));
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
      changed += hv[i] != InitValue(name.substr(0, 1), name.substr(2), static_cast<int64_t>(i));
    }
  }
  EXPECT_GT(changed, 0u);  // training moved the parameters
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
    ::testing::Values(Case{"s0_f32", 0, DType::kF32, 1, GradAccumulationMode::kLowMemory, false, 0},
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
                      Case{"s3_bf16_clip", 3, DType::kBF16, 1, GradAccumulationMode::kLowMemory, false, 1.0},
                      Case{"s1_bf16_offload", 1, DType::kBF16, 1, GradAccumulationMode::kLowMemory, false, 0, 1},
                      Case{"s2_f32_offload_ga2", 2, DType::kF32, 2, GradAccumulationMode::kLowMemory, false, 0, 1},
                      Case{"s3_bf16_offload", 3, DType::kBF16, 1, GradAccumulationMode::kLowMemory, false, 0, 1},
                      Case{"s3_bf16_offload_all", 3, DType::kBF16, 1, GradAccumulationMode::kLowMemory, false, 0, 2},
                      Case{"s3_f32_offload_all", 3, DType::kF32, 1, GradAccumulationMode::kLowMemory, false, 0, 2},
                      Case{"s3_bf16_twinflow", 3, DType::kBF16, 1, GradAccumulationMode::kLowMemory, false, 0, 1, 0.5},
                      Case{"s3_bf16_sr_offload", 3, DType::kBF16, 2, GradAccumulationMode::kLowMemory, true, 0, 1}),
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
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(f.status().message().find("Own"), std::string::npos) << f.status();
}

}  // namespace
}  // namespace zero
