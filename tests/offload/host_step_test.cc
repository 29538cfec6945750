// The pipelined host step equals one ParallelUpdate over the whole range, bit for bit, for every way the
// parameters leave it (copied back through staging in tiles, written in place, or not at all), with tile sizes
// that do and do not divide the range; the staging buffers really are reused.
#include "offload/host_step.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "zero/mixed_precision.h"
#include "zero/optimizer.h"

namespace zero::internal {
namespace {

struct Fixture {
  explicit Fixture(size_t n, DType grad_dtype) : n(n), master(n), m(n), v(n), grad(n * DTypeSize(grad_dtype)) {
    std::mt19937 rng(7);
    std::normal_distribution<float> d(0.f, 1.f);
    for (size_t i = 0; i < n; ++i) {
      master[i] = d(rng);
      m[i] = 0.1f * d(rng);
      v[i] = std::abs(0.01f * d(rng));
      StoreFromF32(grad.data(), grad_dtype, i, d(rng));
    }
  }
  size_t n;
  std::vector<float> master, m, v;
  std::vector<char> grad;
  float* state[2] = {m.data(), v.data()};
};

ShardUpdate MakeUpdate(Fixture& f, DType grad_dtype) {
  ShardUpdate u;
  u.master = f.master.data();
  u.grad = f.grad.data();
  u.grad_dtype = grad_dtype;
  u.grad_scale = 0.5f;
  u.state = f.state;
  u.n = f.n;
  u.step = 3;
  u.lr = 1e-3;
  return u;
}

struct StepCase {
  size_t n, pipeline_tile;
  DType out;
  bool stochastic;
};

class HostStepTest : public ::testing::TestWithParam<StepCase> {};

TEST_P(HostStepTest, CopyBackEqualsOneParallelUpdate) {
  const StepCase c = GetParam();
  auto opt = MakeOptimizer(OptimizerConfig{.type = "AdamW", .lr = 1e-3, .weight_decay = 0.01}).value();
  const DType gd = c.out == DType::kF32 ? DType::kF32 : c.out;
  Fixture ref(c.n, gd), got(c.n, gd);
  const size_t osz = DTypeSize(c.out);
  std::vector<char> want_params(c.n * osz), got_params(c.n * osz, char(0x5A));  // poisoned
  ShardUpdate r = MakeUpdate(ref, gd);
  r.param_out = c.stochastic ? nullptr : want_params.data();
  r.param_out_dtype = c.out;
  ParallelUpdate(*opt, r, 2, 4096);
  if (c.stochastic) {
    StochasticRoundToBF16(ref.master.data(), reinterpret_cast<uint16_t*>(want_params.data()), c.n, 99, 1000);
  }

  MemoryTracker tracker;
  StagingPair staging;
  for (auto& b : staging.buffers) b = Buffer::Host(&tracker, MemTag::kStaging, c.pipeline_tile * osz);
  CopyStream copies;
  HostStep hs;
  hs.u = MakeUpdate(got, gd);
  hs.u.param_out = got_params.data();
  hs.u.param_out_dtype = c.out;
  hs.threads = 2;
  hs.optimizer_tile = 4096;
  hs.pipeline_tile = c.pipeline_tile;
  hs.stochastic = c.stochastic;
  hs.stochastic_key = 99;
  hs.u.first_element = 1000;
  const auto last = RunHostStep(*opt, hs, copies, staging);
  const size_t tiles = (c.n + c.pipeline_tile - 1) / c.pipeline_tile;
  EXPECT_EQ(last, tiles);  // one copy per tile, in order
  copies.Wait(last);
  EXPECT_EQ(std::memcmp(ref.master.data(), got.master.data(), c.n * 4), 0);
  EXPECT_EQ(std::memcmp(ref.m.data(), got.m.data(), c.n * 4), 0);
  EXPECT_EQ(std::memcmp(ref.v.data(), got.v.data(), c.n * 4), 0);
  EXPECT_EQ(std::memcmp(want_params.data(), got_params.data(), c.n * osz), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Tiles, HostStepTest,
    ::testing::Values(StepCase{10000, 1024, DType::kBF16, false}, StepCase{10000, 10000, DType::kBF16, false},
                      StepCase{10007, 999, DType::kF16, false}, StepCase{10007, 333, DType::kF32, false},
                      StepCase{4096, 1000, DType::kBF16, true}, StepCase{1, 1024, DType::kBF16, false}));

// Consecutive steps (units) share the staging pair: with the copy stream held back, the second step must wait
// for the first step's copies before it reuses a buffer, or the first unit would receive the second's values.
TEST(HostStepTest, ConsecutiveStepsShareStagingSafely) {
  auto opt = MakeOptimizer(OptimizerConfig{.type = "AdamW", .lr = 1e-3}).value();
  const size_t n = 3000, tile = 512;
  Fixture ref_a(n, DType::kBF16), ref_b(n, DType::kBF16), a(n, DType::kBF16), b(n, DType::kBF16);
  for (auto* f : {&ref_b, &b}) {
    for (auto& x : f->master) x += 1.0f;  // the two units differ
  }
  std::vector<uint16_t> want_a(n), want_b(n), got_a(n, 0xFFFF), got_b(n, 0xFFFF);
  for (auto [f, out] : {std::pair{&ref_a, &want_a}, std::pair{&ref_b, &want_b}}) {
    ShardUpdate r = MakeUpdate(*f, DType::kBF16);
    r.param_out = out->data();
    r.param_out_dtype = DType::kBF16;
    ParallelUpdate(*opt, r, 1, 1 << 20);
  }
  MemoryTracker tracker;
  StagingPair staging;
  for (auto& buf : staging.buffers) buf = Buffer::Host(&tracker, MemTag::kStaging, tile * 2);
  CopyStream copies;
  std::atomic<bool> go{false};
  copies.Enqueue([&] {
    while (!go.load()) std::this_thread::yield();
  });
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    go = true;
  });
  for (auto [f, out] : {std::pair{&a, &got_a}, std::pair{&b, &got_b}}) {
    HostStep hs;
    hs.u = MakeUpdate(*f, DType::kBF16);
    hs.u.param_out = out->data();
    hs.u.param_out_dtype = DType::kBF16;
    hs.pipeline_tile = tile;
    RunHostStep(*opt, hs, copies, staging);
  }
  copies.Sync();
  releaser.join();
  EXPECT_EQ(want_a, got_a);
  EXPECT_EQ(want_b, got_b);
}

TEST(HostStepTest, InPlaceParametersNeedNoCopy) {
  auto opt = MakeOptimizer(OptimizerConfig{.type = "AdamW", .lr = 1e-3}).value();
  const size_t n = 5000;
  Fixture ref(n, DType::kBF16), got(n, DType::kBF16);
  std::vector<uint16_t> want(n), host_params(n, 0xFFFF);
  ShardUpdate r = MakeUpdate(ref, DType::kBF16);
  r.param_out = want.data();
  r.param_out_dtype = DType::kBF16;
  ParallelUpdate(*opt, r, 1, 1 << 20);
  CopyStream copies;
  StagingPair staging;
  HostStep hs;
  hs.u = MakeUpdate(got, DType::kBF16);
  hs.u.param_out_dtype = DType::kBF16;
  hs.param_host = host_params.data();
  EXPECT_EQ(RunHostStep(*opt, hs, copies, staging), 0u);  // nothing queued
  EXPECT_EQ(copies.last(), 0u);
  EXPECT_EQ(want, host_params);
  EXPECT_EQ(std::memcmp(ref.master.data(), got.master.data(), n * 4), 0);
}

}  // namespace
}  // namespace zero::internal
