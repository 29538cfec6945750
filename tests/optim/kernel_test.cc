// The SIMD kernels against the scalar reference, on every SIMD target this CPU can run, for every gradient
// and parameter-copy dtype, over random and edge inputs: results must be bitwise equal (NaN payloads aside),
// because both compute the same operations in the same order without FMA contraction.

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/internal/convert_simd.h"
#include "gtest/gtest.h"
#include "optim/internal/kernels.h"
#include "optim/test_util.h"
#include "support/simd_target_guard.h"
#include "zero/dtype.h"
#include "zero/optimizer.h"

namespace zero::optim_test {
namespace {

using optim_internal::AdamScalars;
using optim_internal::SgdScalars;
using optim_internal::TileArgs;

// One target for all host kernels (core/internal/convert_simd.h), restored when a test ends, even on failure.
using TargetGuard = testing::SimdTargetGuard;
using internal::AvailableSimdTargets;

struct OptCase {
  std::string name;
  bool adam;
  AdamParams adam_params;
  SgdParams sgd_params;
  double lr;
};

std::vector<OptCase> Cases() {
  std::vector<OptCase> c;
  auto adam = [&](std::string name, AdamParams p, double lr) { c.push_back({name, true, p, {}, lr}); };
  auto sgd = [&](std::string name, SgdParams p, double lr) { c.push_back({name, false, {}, p, lr}); };
  adam("adamw_wd", {.weight_decay = 0.01}, 1e-3);
  adam("adamw_no_wd", {}, 3e-4);
  adam("adam_l2", {.weight_decay = 0.1, .decoupled_weight_decay = false}, 1e-3);
  adam("adam_no_bias_correction", {.weight_decay = 0.05, .bias_correction = false}, 1e-2);
  adam("adamw_beta1_0.3", {.beta1 = 0.3, .beta2 = 0.95, .weight_decay = 0.01}, 1e-3);  // lerp's w >= 0.5 form
  adam("adamw_beta1_0.5", {.beta1 = 0.5, .beta2 = 0.9, .eps = 1e-6}, 1e-3);            // w == 0.5 exactly
  sgd("sgd", {}, 0.1);
  sgd("sgd_wd", {.weight_decay = 1e-4}, 0.1);
  sgd("sgd_momentum", {.momentum = 0.9}, 0.05);
  sgd("sgd_momentum_dampening_wd", {.momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-4}, 0.05);
  sgd("sgd_nesterov", {.momentum = 0.9, .nesterov = true}, 0.05);
  sgd("sgd_nesterov_wd", {.momentum = 0.5, .weight_decay = 0.01, .nesterov = true}, 0.2);
  return c;
}

struct Buffers {
  std::vector<float> master, s0, s1;
  std::vector<uint8_t> grad;
  std::vector<uint8_t> out;
};

Buffers MakeBuffers(DType grad_t, DType out_t, size_t n, uint64_t seed) {
  Buffers b;
  b.master = RandomF32(n, seed, /*edges=*/true, -6, 3);
  b.s0 = RandomF32(n, seed + 1, /*edges=*/true, -8, 0);
  b.s1 = RandomF32(n, seed + 2, /*edges=*/true, -12, 0);
  for (size_t i = 0; i < n; i += 3) b.s1[i] = std::abs(b.s1[i]);  // mostly valid second moments, some negative
  b.grad = RandomGrad(grad_t, n, seed + 3, /*edges=*/true);
  b.out.assign(n * DTypeSize(out_t), 0xAB);
  return b;
}

void RunStep(const OptCase& c, bool fast, Buffers& b, DType grad_t, bool with_out, DType out_t, size_t n, int64_t step,
             float grad_scale) {
  ShardUpdate u;
  u.grad_scale = grad_scale;
  u.step = step;
  u.lr = c.lr;
  u.n = n;
  TileArgs t;
  t.master = b.master.data();
  t.grad = b.grad.data();
  t.grad_dtype = grad_t;
  t.state0 = b.s0.data();
  t.state1 = b.s1.data();
  t.param_out = with_out ? b.out.data() : nullptr;
  t.param_out_dtype = out_t;
  t.n = n;
  if (c.adam) {
    const AdamScalars s = optim_internal::MakeAdamScalars(c.adam_params, u);
    fast ? optim_internal::AdamTile(s, t) : optim_internal::AdamTileReference(s, t);
  } else {
    const SgdScalars s = optim_internal::MakeSgdScalars(c.sgd_params, u);
    fast ? optim_internal::SgdTile(s, t) : optim_internal::SgdTileReference(s, t);
  }
}

TEST(OptimKernels, MatchReferenceBitwiseOnEveryTarget) {
  const std::vector<internal::SimdTarget> targets = AvailableSimdTargets();
  ASSERT_FALSE(targets.empty());
  const DType kTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
  const size_t kSizes[] = {1, 7, 16, 17, 64, 1000, 1031};
  for (const auto& target : targets) {
    TargetGuard guard(target.bits);
    ASSERT_EQ(optim_internal::ActiveKernelTarget(), target.name);
    for (const OptCase& c : Cases()) {
      for (DType grad_t : kTypes) {
        for (int out_i = 0; out_i < 4; ++out_i) {
          const bool with_out = out_i < 3;
          const DType out_t = with_out ? kTypes[out_i] : DType::kF32;
          for (size_t n : kSizes) {
            SCOPED_TRACE(target.name + " " + c.name + " grad=" + std::string(DTypeName(grad_t)) +
                         " out=" + (with_out ? std::string(DTypeName(out_t)) : "none") + " n=" + std::to_string(n));
            Buffers fast = MakeBuffers(grad_t, out_t, n, 1000 * n + out_i);
            Buffers ref = fast;
            for (int64_t step = 1; step <= 3; ++step) {
              const float scale = step == 2 ? 0.25f : 1.0f;
              RunStep(c, true, fast, grad_t, with_out, out_t, n, step, scale);
              RunStep(c, false, ref, grad_t, with_out, out_t, n, step, scale);
              ASSERT_TRUE(SameBuffer(fast.master.data(), ref.master.data(), DType::kF32, n, "master"));
              ASSERT_TRUE(SameBuffer(fast.s0.data(), ref.s0.data(), DType::kF32, n, "state0"));
              ASSERT_TRUE(SameBuffer(fast.s1.data(), ref.s1.data(), DType::kF32, n, "state1"));
              ASSERT_TRUE(SameBuffer(fast.out.data(), ref.out.data(), out_t, n, "param_out"));
            }
          }
        }
      }
    }
  }
}

// Every f16 and bf16 gradient bit pattern is widened exactly as zero/dtype.h does (SGD with lr = -1 from a
// zero parameter leaves p = 0 + g, which is g except that -0 becomes +0).
TEST(OptimKernels, GradientLoadMatchesDtypeOnAllPatterns) {
  for (const auto& target : AvailableSimdTargets()) {
    TargetGuard guard(target.bits);
    for (DType t : {DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(target.name + " " + std::string(DTypeName(t)));
      const size_t n = 1 << 16;
      std::vector<uint16_t> grad(n);
      for (size_t i = 0; i < n; ++i) grad[i] = static_cast<uint16_t>(i);
      std::vector<float> master(n, 0.0f), expected(n);
      for (size_t i = 0; i < n; ++i) expected[i] = 0.0f + LoadAsF32(grad.data(), t, i);
      ShardUpdate u;
      u.lr = -1.0;
      TileArgs a{.master = master.data(), .grad = grad.data(), .grad_dtype = t, .n = n};
      optim_internal::SgdTile(optim_internal::MakeSgdScalars(SgdParams{}, u), a);
      EXPECT_TRUE(SameBuffer(master.data(), expected.data(), DType::kF32, n, "widened"));
    }
  }
}

// The parameter copy rounds exactly as zero/dtype.h: every bf16/f16 rounding boundary (all 2^16 upper halves
// with tie and near-tie lower halves) plus random bit patterns. SGD with lr = 0 and a zero gradient leaves the
// master unchanged (p + -0 == p), so param_out is the conversion of the original value.
TEST(OptimKernels, ParamOutRoundsLikeDtypeOnBoundaries) {
  std::vector<float> values;
  const uint32_t kLow[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x2000, 0x7FFF, 0x8000, 0x8001, 0xFFFF};
  for (uint32_t hi = 0; hi < (1u << 16); ++hi) {
    for (uint32_t lo : kLow) values.push_back(BitsToFloat(hi << 16 | lo));
  }
  std::mt19937 rng(7);
  for (int i = 0; i < (1 << 18); ++i) values.push_back(BitsToFloat(static_cast<uint32_t>(rng())));
  const size_t n = values.size();
  for (const auto& target : AvailableSimdTargets()) {
    TargetGuard guard(target.bits);
    for (DType t : {DType::kF16, DType::kBF16, DType::kF32}) {
      SCOPED_TRACE(target.name + " " + std::string(DTypeName(t)));
      std::vector<float> master = values;
      std::vector<float> grad(n, 0.0f);
      std::vector<uint8_t> out(n * DTypeSize(t)), expected(n * DTypeSize(t));
      for (size_t i = 0; i < n; ++i) StoreFromF32(expected.data(), t, i, values[i]);
      ShardUpdate u;
      u.lr = 0.0;
      TileArgs a{.master = master.data(), .grad = grad.data(), .param_out = out.data(), .param_out_dtype = t, .n = n};
      optim_internal::SgdTile(optim_internal::MakeSgdScalars(SgdParams{}, u), a);
      EXPECT_TRUE(SameBuffer(out.data(), expected.data(), t, n, "param_out"));
    }
  }
}

}  // namespace
}  // namespace zero::optim_test
