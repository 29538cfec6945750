// ShardedOptimizer over device buffers (an NCCL communicator, world size 1) against the host run: the CUDA
// kernels reproduce the host arithmetic bit for bit, so the trainer's parameters must match exactly at stages 0-2.
// Labelled gpu: skipped without a CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "support/engine_helpers.h"
#include "zero/advanced/cuda_kernels.h"
#include "zero/communicator.h"
#include "zero/sharded_optimizer.h"
#include "zero/store.h"

namespace zero {
namespace {

constexpr int64_t kN = 3 * 257 + 5;
const std::vector<ParamSpec> kTensors = {{"w", {3, 257}}, {"b", {5}}};

void Grad(const std::vector<float>& p, int step, std::vector<float>* g) {
  for (int64_t i = 0; i < kN; ++i) (*g)[i] = 0.03f * std::sin(0.11f * static_cast<float>(i) + step) + 0.1f * p[i];
}

Config MakeConfig(int stage) {
  Config c = testing::TrainConfig(stage, 1, 1, 1e-2, /*clip=*/0.0);
  c.optimizer->weight_decay = 0.05;
  return c;
}

// The host run: the trainer's buffers in host memory, a Gloo communicator of one rank.
std::vector<float> HostRun(int stage, int steps) {
  const int64_t cap = ShardedOptimizer::Capacity(kN, 1);
  std::vector<float> p(cap, 0.0f), g(cap, 0.0f), tmp(kN);
  for (int64_t i = 0; i < kN; ++i) p[i] = 0.2f * std::cos(0.5f * static_cast<float>(i));
  auto comm = Communicator::CreateGloo(Store::Hash(), 0, 1, {});
  EXPECT_OK(comm);
  auto opt = ShardedOptimizer::Create(MakeConfig(stage), std::move(*comm),
                                      {FlatBuffers{p.data(), g.data(), DType::kF32, cap, kTensors}});
  EXPECT_OK(opt);
  for (int t = 1; t <= steps; ++t) {
    Grad(p, t, &tmp);
    std::copy(tmp.begin(), tmp.end(), g.begin());
    EXPECT_OK((*opt)->Step());
  }
  p.resize(kN);
  return p;
}

TEST(CudaShardedOptimizer, DeviceBuffersMatchTheHostRunBitwise) {
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  for (int stage = 0; stage <= 2; ++stage) {
    SCOPED_TRACE(::testing::Message() << "stage " << stage);
    const std::vector<float> want = HostRun(stage, 6);
    const int64_t cap = ShardedOptimizer::Capacity(kN, 1);
    float *dp = nullptr, *dg = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dp), cap * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dg), cap * 4), cudaSuccess);
    std::vector<float> p(cap, 0.0f), g(kN);
    for (int64_t i = 0; i < kN; ++i) p[i] = 0.2f * std::cos(0.5f * static_cast<float>(i));
    ASSERT_EQ(cudaMemcpy(dp, p.data(), cap * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(dg, 0, cap * 4), cudaSuccess);
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Communicator> nccl, Communicator::CreateNccl(Store::Hash(), 0, 1, {}));
    ASSERT_OK_AND_ASSIGN(
        auto opt, ShardedOptimizer::Create(MakeConfig(stage), nccl, {FlatBuffers{dp, dg, DType::kF32, cap, kTensors}}));
    for (int t = 1; t <= 6; ++t) {
      // The trainer's backward: here on the host, from the device parameters (the engine's stream done first).
      ASSERT_EQ(cudaStreamSynchronize(opt->cuda_stream()), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(p.data(), dp, kN * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      Grad(p, t, &g);
      ASSERT_EQ(cudaMemcpy(dg, g.data(), kN * 4, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_OK(opt->Step());
    }
    ASSERT_EQ(cudaStreamSynchronize(opt->cuda_stream()), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(p.data(), dp, kN * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    p.resize(kN);
    EXPECT_EQ(p, want);
    opt.reset();
    cudaFree(dp);
    cudaFree(dg);
  }
}

}  // namespace
}  // namespace zero
