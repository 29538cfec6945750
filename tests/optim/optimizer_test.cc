// The built-in optimizers through the public API: factories and validation, the update formulas against
// independent double-precision implementations of torch.optim's math, and (when /usr/bin/python3 has torch)
// against torch.optim itself.

#include "zero/optimizer.h"
#include "support/files.h"

#include <gmock/gmock.h>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "optim/test_util.h"
#include "support/status_matchers.h"
#include "zero/config.h"
#include "zero/dtype.h"

namespace zero::optim_test {
namespace {

using ::testing::HasSubstr;
using ::zero::testing::StatusIs;

// Runs `opt` for one step over whole buffers.
void Step(const ElementwiseOptimizer& opt, std::vector<float>& p, const std::vector<float>& g,
          std::vector<std::vector<float>>& states, int64_t step, double lr, float grad_scale = 1.0f,
          void* param_out = nullptr, DType out_t = DType::kBF16) {
  std::vector<float*> sp;
  for (auto& s : states) sp.push_back(s.data());
  ShardUpdate u;
  u.master = p.data();
  u.grad = g.data();
  u.grad_dtype = DType::kF32;
  u.grad_scale = grad_scale;
  u.state = sp.data();
  u.param_out = param_out;
  u.param_out_dtype = out_t;
  u.n = p.size();
  u.step = step;
  u.lr = lr;
  opt.Update(u);
}

std::vector<std::vector<float>> ZeroStates(const ElementwiseOptimizer& opt, size_t n) {
  return std::vector<std::vector<float>>(opt.StateNames().size(), std::vector<float>(n, 0.0f));
}

TEST(MakeOptimizer, TypesFollowDeepSpeed) {
  OptimizerConfig cfg;
  cfg.type = "Adam";
  auto a = MakeOptimizer(cfg);
  ASSERT_OK(a);
  EXPECT_EQ((*a)->Name(), "AdamW");  // DeepSpeed: "Adam" means AdamW unless adam_w_mode is false
  EXPECT_EQ((*a)->StateNames(), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  cfg.adam_w_mode = false;
  EXPECT_EQ((*MakeOptimizer(cfg))->Name(), "Adam");
  cfg.type = "AdamW";  // always decoupled
  EXPECT_EQ((*MakeOptimizer(cfg))->Name(), "AdamW");
  cfg.type = "sgd";
  auto s = MakeOptimizer(cfg);
  ASSERT_OK(s);
  EXPECT_EQ((*s)->Name(), "SGD");
  EXPECT_TRUE((*s)->StateNames().empty());  // no momentum, no buffer (as torch)
  cfg.momentum = 0.9;
  EXPECT_EQ((*MakeOptimizer(cfg))->StateNames(), (std::vector<std::string>{"momentum_buffer"}));
}

TEST(MakeOptimizer, RejectsWhatTorchRejectsNamingTheKey) {
  auto expect_error = [](OptimizerConfig cfg, const std::string& key) {
    auto r = MakeOptimizer(cfg);
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(key))) << key;
  };
  OptimizerConfig c;
  c.type = "Lamb";
  expect_error(c, "optimizer.type");
  c = {};
  c.lr = -1;
  expect_error(c, "optimizer.params.lr");
  c = {};
  c.beta1 = 1.0;
  expect_error(c, "optimizer.params.betas[0]");
  c = {};
  c.beta2 = -0.1;
  expect_error(c, "optimizer.params.betas[1]");
  c = {};
  c.eps = -1e-8;
  expect_error(c, "optimizer.params.eps");
  c = {};
  c.weight_decay = -0.1;
  expect_error(c, "optimizer.params.weight_decay");
  c = {};
  c.type = "SGD";
  c.nesterov = true;  // momentum 0
  expect_error(c, "optimizer.params.nesterov");
  c.momentum = 0.9;
  c.dampening = 0.1;
  expect_error(c, "optimizer.params.nesterov");
  c.dampening = 0.0;
  EXPECT_OK(MakeOptimizer(c));
}

// AdamW/Adam over several steps against a double-precision transcription of torch.optim.AdamW's algorithm
// (the documented one, not our operation order): agreement to f32 rounding noise shows the formula, bias
// corrections and decay placement are right; bitwise agreement with our reference is kernel_test's job.
// The checked form of Update's preconditions: each missing field is named, and a complete update passes (the
// unchecked Update aborts on the same ones).
TEST(ValidateShardUpdate, NamesTheMissingField) {
  auto adam = MakeAdam(AdamParams{});
  std::vector<float> master(4, 1.0f), grad(4, 0.5f), m(4), v(4);
  float* states[2] = {m.data(), v.data()};
  ShardUpdate u{.master = master.data(), .grad = grad.data(), .state = states, .n = 4, .step = 1, .lr = 0.1};
  EXPECT_OK(ValidateShardUpdate(*adam, u));
  ShardUpdate bad = u;
  bad.master = nullptr;
  EXPECT_THAT(ValidateShardUpdate(*adam, bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("master is null")));
  bad = u;
  bad.grad = nullptr;
  EXPECT_THAT(ValidateShardUpdate(*adam, bad), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("grad is null")));
  bad = u;
  bad.step = 0;
  EXPECT_THAT(ValidateShardUpdate(*adam, bad), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1-based")));
  bad = u;
  bad.state = nullptr;
  EXPECT_THAT(ValidateShardUpdate(*adam, bad), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2 states")));
  float* half[2] = {m.data(), nullptr};
  bad = u;
  bad.state = half;
  EXPECT_THAT(ValidateShardUpdate(*adam, bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("state[1] (exp_avg_sq) is null")));
  bad = u;
  bad.n = 0;
  bad.master = nullptr;
  EXPECT_OK(ValidateShardUpdate(*adam, bad));  // an empty tile needs no buffers
  // SGD without momentum has no state.
  auto sgd = MakeSgd(SgdParams{});
  bad = u;
  bad.state = nullptr;
  EXPECT_OK(ValidateShardUpdate(*sgd, bad));
}

TEST(AdamFormula, MatchesDoublePrecisionTorchAlgorithm) {
  for (bool decoupled : {true, false}) {
    for (bool bias_correction : {true, false}) {
      SCOPED_TRACE(std::string(decoupled ? "AdamW" : "Adam") + (bias_correction ? "" : " no-bc"));
      const AdamParams ap{.beta1 = 0.9,
                          .beta2 = 0.99,
                          .eps = 1e-6,
                          .weight_decay = 0.05,
                          .decoupled_weight_decay = decoupled,
                          .bias_correction = bias_correction};
      auto opt = MakeAdam(ap);
      const size_t n = 257;
      std::vector<float> p = RandomF32(n, 11, false, -2, 0);
      std::vector<double> pd(p.begin(), p.end()), md(n, 0.0), vd(n, 0.0);
      std::vector<double> m_mag(n, 0.0);  // the same average over |g|: m's rounding errors scale with it
      auto states = ZeroStates(*opt, n);
      const double lr = 2e-3;
      const float scale = 0.5f;
      for (int64_t step = 1; step <= 10; ++step) {
        std::vector<float> g = RandomF32(n, 100 + step, false, -3, 1);
        Step(*opt, p, g, states, step, lr, scale);
        const double bc1 = bias_correction ? 1 - std::pow(ap.beta1, step) : 1.0;
        const double bc2 = bias_correction ? 1 - std::pow(ap.beta2, step) : 1.0;
        for (size_t i = 0; i < n; ++i) {
          double gi = static_cast<double>(g[i]) * scale;
          if (decoupled) pd[i] *= 1 - lr * ap.weight_decay;
          else gi += ap.weight_decay * pd[i];
          md[i] = ap.beta1 * md[i] + (1 - ap.beta1) * gi;
          m_mag[i] = ap.beta1 * m_mag[i] + (1 - ap.beta1) * std::abs(gi);
          vd[i] = ap.beta2 * vd[i] + (1 - ap.beta2) * gi * gi;
          pd[i] -= lr / bc1 * md[i] / (std::sqrt(vd[i]) / std::sqrt(bc2) + ap.eps);
        }
      }
      for (size_t i = 0; i < n; ++i) {
        ASSERT_NEAR(p[i], pd[i], 1e-6 * std::max(1.0, std::abs(pd[i]))) << i;
        ASSERT_NEAR(states[0][i], md[i], 1e-5 * m_mag[i]) << i;
        ASSERT_NEAR(states[1][i], vd[i], 1e-5 * std::abs(vd[i]) + 1e-20) << i;
      }
    }
  }
}

// torch.optim.SGD: the first step's buffer is the gradient itself (not (1 - dampening) * grad), then
// buf = momentum * buf + (1 - dampening) * grad; nesterov steps along grad + momentum * buf.
TEST(SgdFormula, MatchesDoublePrecisionTorchAlgorithm) {
  for (bool nesterov : {false, true}) {
    const SgdParams sp{.momentum = 0.9, .dampening = nesterov ? 0.0 : 0.5, .weight_decay = 0.01, .nesterov = nesterov};
    auto opt = MakeSgd(sp);
    const size_t n = 100;
    std::vector<float> p = RandomF32(n, 3, false, -2, 0);
    std::vector<double> pd(p.begin(), p.end()), bd(n, 0.0);
    auto states = ZeroStates(*opt, n);
    ASSERT_EQ(states.size(), 1u);
    for (int64_t step = 1; step <= 5; ++step) {
      std::vector<float> g = RandomF32(n, 50 + step, false, -3, 0);
      Step(*opt, p, g, states, step, 0.1);
      for (size_t i = 0; i < n; ++i) {
        const double gi = g[i] + sp.weight_decay * pd[i];
        bd[i] = step == 1 ? gi : sp.momentum * bd[i] + (1 - sp.dampening) * gi;
        pd[i] -= 0.1 * (nesterov ? gi + sp.momentum * bd[i] : bd[i]);
      }
    }
    for (size_t i = 0; i < n; ++i) ASSERT_NEAR(p[i], pd[i], 1e-6 * std::max(1.0, std::abs(pd[i])));
  }
}

// The first SGD step with dampening stores the gradient unchanged (torch clones it).
TEST(SgdFormula, FirstStepBufferIsTheGradient) {
  auto opt = MakeSgd({.momentum = 0.9, .dampening = 0.5});
  std::vector<float> p = {1.0f, -2.0f, 3.0f}, g = {0.5f, -0.25f, 1e-3f};
  auto states = ZeroStates(*opt, 3);
  Step(*opt, p, g, states, 1, 0.1);
  EXPECT_EQ(states[0], g);
  Step(*opt, p, g, states, 2, 0.1);
  for (size_t i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(states[0][i], g[i] * 0.9f + 0.5f * g[i]);
}

// AdamW's first step moves each weight by lr * g / (|g| + eps) after the decoupled decay (m_hat = g,
// v_hat = g^2), a closed form worked out by hand.
TEST(AdamFormula, FirstStepClosedForm) {
  auto opt = MakeAdam({.weight_decay = 0.1});
  std::vector<float> p = {1.0f, -1.0f, 0.5f, 2.0f}, g = {0.3f, -4.0f, 1e-3f, 0.0f};
  auto states = ZeroStates(*opt, 4);
  std::vector<uint16_t> p16(4);
  Step(*opt, p, g, states, 1, 1e-2, 1.0f, p16.data(), DType::kBF16);
  const double expected[] = {1.0 * (1 - 1e-3) - 1e-2 * 0.3 / (0.3 + 1e-8), -1.0 * (1 - 1e-3) + 1e-2 * 4 / (4 + 1e-8),
                             0.5 * (1 - 1e-3) - 1e-2 * 1e-3 / (1e-3 + 1e-8), 2.0 * (1 - 1e-3)};
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(p[i], expected[i], 2e-7 * std::abs(expected[i])) << i;
    EXPECT_EQ(p16[i], F32ToBF16(p[i])) << i;  // the bf16 copy is the rounded master
  }
}

// ---- cross-check against torch.optim (skipped where /usr/bin/python3 has no torch) ----

bool TorchAvailable() { return std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0; }

template <class T>
void WriteRaw(const std::string& path, const std::vector<T>& v) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
}

std::vector<float> ReadRaw(const std::string& path, size_t n) {
  std::vector<float> v(n);
  std::ifstream f(path, std::ios::binary);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(float)));
  return v;
}

TEST(TorchCrossCheck, AdamWAdamSgdAgreeWithTorchOptim) {
  if (!TorchAvailable()) GTEST_SKIP() << "/usr/bin/python3 cannot import torch";
  const size_t n = 4096;
  const int steps = 10;
  const std::string dir = zero::testing::MakeTempDir("zero_optim_torch");
  std::vector<float> p0 = RandomF32(n, 21, false, -2, 0);
  std::vector<float> grads;
  for (int s = 1; s <= steps; ++s) {
    std::vector<float> g = RandomF32(n, 200 + s, false, -4, 0);
    grads.insert(grads.end(), g.begin(), g.end());
  }
  WriteRaw(dir + "/p0.bin", p0);
  WriteRaw(dir + "/grads.bin", grads);
  const std::string cmd = "/usr/bin/python3 " ZERO_OPTIM_TEST_DIR "/torch_crosscheck.py " + dir + " " +
                          std::to_string(n) + " " + std::to_string(steps);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  struct Variant {
    std::string name;
    std::unique_ptr<ElementwiseOptimizer> opt;
    double lr;
  };
  std::vector<Variant> variants;
  variants.push_back({"adamw", MakeAdam({.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01}), 1e-3});
  variants.push_back({"adam_l2", MakeAdam({.weight_decay = 0.01, .decoupled_weight_decay = false}), 1e-3});
  variants.push_back({"sgd_nesterov", MakeSgd({.momentum = 0.9, .weight_decay = 1e-4, .nesterov = true}), 0.05});
  variants.push_back({"sgd_dampening", MakeSgd({.momentum = 0.9, .dampening = 0.1}), 0.05});
  for (auto& var : variants) {
    std::vector<float> p = p0;
    std::vector<float> scale(p0.size());  // the largest |p| each element reached: the terms' magnitude
    for (size_t i = 0; i < n; ++i) scale[i] = std::abs(p0[i]);
    auto states = ZeroStates(*var.opt, n);
    for (int s = 1; s <= steps; ++s) {
      std::vector<float> g(grads.begin() + (s - 1) * n, grads.begin() + s * n);
      Step(*var.opt, p, g, states, s, var.lr);
      for (size_t i = 0; i < n; ++i) scale[i] = std::max(scale[i], std::abs(p[i]));
    }
    const std::vector<float> torch_p = ReadRaw(dir + "/" + var.name + ".bin", n);
    // Differences in units of the last place of the largest value each parameter took: a parameter that
    // decays from 0.5 to 1e-4 carries absolute rounding errors of 0.5's ulps, which would look like
    // thousands of ulps of 1e-4.
    double max_ulp = 0;
    for (size_t i = 0; i < n; ++i) {
      const double ulp = std::nextafter(scale[i], INFINITY) - scale[i];
      max_ulp = std::max(max_ulp, std::abs(static_cast<double>(p[i]) - torch_p[i]) / ulp);
    }
    // torch's vectorized CPU ops fuse some multiply-adds (add with alpha, lerp on AVX2 builds) and torch 1.13
    // updates exp_avg with mul_/add_ rather than lerp_, so a few ulps of drift over 10 steps are expected.
    std::printf("[ torch ] %-14s max |ours - torch| over %zu params after %d steps: %.2f ulp (of max |p|)\n",
                var.name.c_str(), n, steps, max_ulp);
    EXPECT_LE(max_ulp, 16) << var.name;
  }
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace zero::optim_test
