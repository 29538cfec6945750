// ParallelUpdate: results independent of threads and tiles (bitwise), plug-in optimizers run through it,
// concurrent callers (thread ranks) share the pool safely.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "optim/test_util.h"
#include "zero/dtype.h"
#include "zero/optimizer.h"

namespace zero::optim_test {
namespace {

// A shard with its gradient, states and 16-bit parameter copy.
struct Shard {
  std::vector<float> master;
  std::vector<uint8_t> grad;
  std::vector<std::vector<float>> states;
  std::vector<float*> state_ptrs;
  std::vector<uint16_t> out;
  DType grad_t;

  Shard(const ElementwiseOptimizer& opt, size_t n, DType g, uint64_t seed) : grad_t(g) {
    master = RandomF32(n, seed, false, -3, 0);
    grad = RandomGrad(g, n, seed + 1, false);
    states.assign(opt.StateNames().size(), std::vector<float>(n, 0.0f));
    out.assign(n, 0);
  }
  // Builds the update for this shard's buffers (pointers taken here, so copies of a Shard are independent).
  ShardUpdate Update(int64_t step, double lr) {
    state_ptrs.clear();
    for (auto& s : states) state_ptrs.push_back(s.data());
    ShardUpdate u;
    u.master = master.data();
    u.grad = grad.data();
    u.grad_dtype = grad_t;
    u.grad_scale = 0.5f;
    u.state = state_ptrs.empty() ? nullptr : state_ptrs.data();
    u.param_out = out.data();
    u.param_out_dtype = DType::kBF16;
    u.n = master.size();
    u.step = step;
    u.lr = lr;
    return u;
  }
};

::testing::AssertionResult SameShard(const Shard& a, const Shard& b) {
  auto r = SameBuffer(a.master.data(), b.master.data(), DType::kF32, a.master.size(), "master");
  if (!r) return r;
  for (size_t k = 0; k < a.states.size(); ++k) {
    r = SameBuffer(a.states[k].data(), b.states[k].data(), DType::kF32, a.master.size(), "state" + std::to_string(k));
    if (!r) return r;
  }
  return SameBuffer(a.out.data(), b.out.data(), DType::kBF16, a.master.size(), "param_out");
}

// Lion (Chen et al. 2023), a trainer's own optimizer through the plug-in interface:
//   c = beta1 * m + (1 - beta1) * g;  p = p * (1 - lr * wd) - lr * sign(c);  m = beta2 * m + (1 - beta2) * g
class Lion final : public ElementwiseOptimizer {
 public:
  std::string Name() const override { return "Lion"; }
  std::vector<std::string> StateNames() const override { return {"exp_avg"}; }
  void Update(const ShardUpdate& u) const override {
    const float* g = static_cast<const float*>(u.grad);
    float* m = u.state[0];
    const float lr = static_cast<float>(u.lr);
    for (size_t i = 0; i < u.n; ++i) {
      const float gi = g[i] * u.grad_scale;
      const float c = 0.9f * m[i] + 0.1f * gi;
      const float sign = c > 0 ? 1.0f : (c < 0 ? -1.0f : 0.0f);
      u.master[i] = u.master[i] * (1.0f - lr * 0.01f) - lr * sign;
      m[i] = 0.99f * m[i] + 0.01f * gi;
      if (u.param_out != nullptr) StoreFromF32(u.param_out, u.param_out_dtype, i, u.master[i]);
    }
  }
};

// Stateless sign-SGD: also checks that ParallelUpdate accepts a null state array for zero states.
class SignSgd final : public ElementwiseOptimizer {
 public:
  std::string Name() const override { return "SignSGD"; }
  std::vector<std::string> StateNames() const override { return {}; }
  void Update(const ShardUpdate& u) const override {
    const float* g = static_cast<const float*>(u.grad);
    for (size_t i = 0; i < u.n; ++i) {
      u.master[i] -= static_cast<float>(u.lr) * (g[i] > 0 ? 1.0f : (g[i] < 0 ? -1.0f : 0.0f));
      if (u.param_out != nullptr) StoreFromF32(u.param_out, u.param_out_dtype, i, u.master[i]);
    }
  }
};

struct Named {
  std::string name;
  std::shared_ptr<ElementwiseOptimizer> opt;
  DType grad_t;
};

std::vector<Named> Optimizers() {
  return {{"adamw_bf16", MakeAdam({.weight_decay = 0.01}), DType::kBF16},
          {"adam_l2_f32", MakeAdam({.weight_decay = 0.01, .decoupled_weight_decay = false}), DType::kF32},
          {"sgd_nesterov_f16", MakeSgd({.momentum = 0.9, .nesterov = true}), DType::kF16},
          {"sgd_plain_f32", MakeSgd({}), DType::kF32},
          {"lion", std::make_shared<Lion>(), DType::kF32},
          {"sign_sgd", std::make_shared<SignSgd>(), DType::kF32}};
}

// Big enough that ParallelUpdate really uses several threads (it keeps >= 32K elements per thread), odd so
// tiles and vectors have tails.
constexpr size_t kN = 200003;

TEST(ParallelUpdate, IndependentOfThreadsAndTiles) {
  for (const Named& o : Optimizers()) {
    SCOPED_TRACE(o.name);
    const Shard initial(*o.opt, kN, o.grad_t, 42);
    Shard expected = initial;
    for (int64_t step = 1; step <= 2; ++step) o.opt->Update(expected.Update(step, 1e-2));  // one tile, one thread
    const int kThreads[] = {1, 2, 3, 8};
    const size_t kTiles[] = {0, 1, 5, 64, 1000, 65536, kN};
    for (int threads : kThreads) {
      for (size_t tile : kTiles) {
        if (tile == 1 && threads != 2) continue;  // 200K one-element tiles: slow; once is enough
        SCOPED_TRACE("threads=" + std::to_string(threads) + " tile=" + std::to_string(tile));
        Shard s = initial;
        for (int64_t step = 1; step <= 2; ++step) ParallelUpdate(*o.opt, s.Update(step, 1e-2), threads, tile);
        ASSERT_TRUE(SameShard(s, expected));
      }
    }
  }
}

TEST(ParallelUpdate, PluginLionMatchesItsOwnLoop) {
  Lion lion;
  Shard direct(lion, 1000, DType::kF32, 9), parallel(lion, 1000, DType::kF32, 9);
  // The direct loop, written out here once more, is the specification.
  for (int64_t step = 1; step <= 3; ++step) {
    const float* g = reinterpret_cast<const float*>(direct.grad.data());
    for (size_t i = 0; i < 1000; ++i) {
      const float gi = g[i] * 0.5f;
      float& m = direct.states[0][i];
      const float c = 0.9f * m + 0.1f * gi;
      direct.master[i] = direct.master[i] * (1.0f - 1e-2f * 0.01f) - 1e-2f * (c > 0 ? 1.0f : (c < 0 ? -1.0f : 0.0f));
      m = 0.99f * m + 0.01f * gi;
      direct.out[i] = F32ToBF16(direct.master[i]);
    }
    ParallelUpdate(lion, parallel.Update(step, 1e-2), 4, 7);
  }
  EXPECT_TRUE(SameShard(parallel, direct));
  EXPECT_NE(direct.states[0][0], 0.0f);  // the state really was used
}

// N thread-ranks in one process each run their own ParallelUpdate at the same time.
TEST(ParallelUpdate, ConcurrentCallersShareThePool) {
  auto opt = MakeAdam({.weight_decay = 0.01});
  const int kRanks = 4;
  std::vector<std::unique_ptr<Shard>> shards, expected;
  for (int r = 0; r < kRanks; ++r) {
    shards.push_back(std::make_unique<Shard>(*opt, kN, DType::kBF16, 100 + r));
    expected.push_back(std::make_unique<Shard>(*opt, kN, DType::kBF16, 100 + r));
    for (int64_t step = 1; step <= 5; ++step) opt->Update(expected[r]->Update(step, 1e-3));
  }
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      for (int64_t step = 1; step <= 5; ++step) ParallelUpdate(*opt, shards[r]->Update(step, 1e-3), 3, 10000);
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_TRUE(SameShard(*shards[r], *expected[r])) << "rank " << r;
}

TEST(ParallelUpdate, EmptyShardAndDegenerateArguments) {
  auto opt = MakeAdam({});
  ShardUpdate u;  // n = 0, null pointers: nothing to do
  ParallelUpdate(*opt, u, 4, 100);
  Shard a(*opt, 100, DType::kF32, 1), b(*opt, 100, DType::kF32, 1);
  ParallelUpdate(*opt, a.Update(1, 1e-3), 0, 0);  // threads < 1 means 1; tile 0 means no limit
  opt->Update(b.Update(1, 1e-3));
  EXPECT_TRUE(SameShard(a, b));
}

}  // namespace
}  // namespace zero::optim_test
