// tests/support/flat_mlp.h — a C-style trainer of the classic kind for ShardedOptimizer's tests: one flat
// parameter buffer, one gradient buffer, tensors as slices, plain-loop forward/backward and its own AdamW loop
// (torch's formulas). Shared by tests/shard/sharded_optimizer_test.cc (thread ranks) and its process worker, and,
// at a larger Shape, by tests/shard/true_peak_test.cc (the model registered as one unit).
// defines: the model's shape constants, Shape, Input, Target, InitParams, ForwardBackward, OwnAdamW, ReferenceRun,
// RelativeDifference.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "zero/engine.h"

namespace zero::testing::flat_mlp {

// y = w2 · tanh(W1 x + b1) + b2 over D inputs and H hidden units; parameters flat: W1 [H, D], b1 [H], w2 [H], b2.
inline constexpr int kD = 13, kH = 37, kBatch = 24;
inline constexpr int64_t kNumel = kH * kD + kH + kH + 1;
inline const std::vector<ParamSpec> kTensors = {{"w1", {kH, kD}}, {"b1", {kH}}, {"w2", {kH}}, {"b2", {1}}};
inline constexpr double kLr = 1e-2, kBeta1 = 0.9, kBeta2 = 0.95, kEps = 1e-8, kWd = 0.05;

// The same model at another width: D inputs, H hidden units (the constants above are Shape{kD, kH}).
struct Shape {
  int d = kD, h = kH;
  int64_t numel() const { return static_cast<int64_t>(h) * d + h + h + 1; }
  std::vector<ParamSpec> tensors() const { return {{"w1", {h, d}}, {"b1", {h}}, {"w2", {h}}, {"b2", {1}}}; }
};

inline float Input(int step, int b, int i, int d = kD) {
  return std::sin(0.37f * static_cast<float>(b * d + i) + 0.11f * step);
}
inline float Target(int step, int b) { return std::cos(0.23f * static_cast<float>(b) + 0.07f * step); }

inline void InitParams(float* p, const Shape& s = {}) {
  for (int64_t i = 0; i < s.numel(); ++i) p[i] = 0.3f * std::sin(1.7f * static_cast<float>(i) + 0.5f);
}

// The trainer's forward and backward over samples [b0, b1) of the step's global batch: writes the gradient of
// the MEAN loss over those samples into g (overwriting) and returns that loss.
inline float ForwardBackward(const float* p, float* g, int step, int b0, int b1, const Shape& s = {}) {
  const int D = s.d, H = s.h;
  const float *W1 = p, *B1 = p + static_cast<int64_t>(H) * D, *W2 = B1 + H, *B2 = W2 + H;
  float *gW1 = g, *gB1 = g + static_cast<int64_t>(H) * D, *gW2 = gB1 + H, *gB2 = gW2 + H;
  std::memset(g, 0, s.numel() * sizeof(float));
  const float inv = 1.0f / static_cast<float>(b1 - b0);
  float loss = 0;
  std::vector<float> h(H), x(D);
  for (int b = b0; b < b1; ++b) {
    for (int i = 0; i < D; ++i) x[i] = Input(step, b, i, D);
    float out = B2[0];
    for (int j = 0; j < H; ++j) {
      float a = B1[j];
      for (int i = 0; i < D; ++i) a += W1[static_cast<int64_t>(j) * D + i] * x[i];
      h[j] = std::tanh(a);
      out += W2[j] * h[j];
    }
    const float err = out - Target(step, b);
    loss += err * err * inv;
    const float dout = 2 * err * inv;
    gB2[0] += dout;
    for (int j = 0; j < H; ++j) {
      gW2[j] += dout * h[j];
      const float da = dout * W2[j] * (1 - h[j] * h[j]);
      gB1[j] += da;
      for (int i = 0; i < D; ++i) gW1[static_cast<int64_t>(j) * D + i] += da * x[i];
    }
  }
  return loss;
}

// The trainer's own AdamW, written as torch.optim.AdamW's single-tensor CPU path runs it (each line one tensor
// op, scalars formed in double and rounded to f32 once): a trainer that follows torch's formulas. (llm.c's loop
// orders the same math differently, which moves the parameters by ~1e-5 relative over 50 steps on its own.)
inline void OwnAdamW(float* p, const float* g, float* m, float* v, int t) {
  const float decay = static_cast<float>(1.0 - kLr * kWd), w = static_cast<float>(1.0 - kBeta1);
  const float b2 = static_cast<float>(kBeta2), one_minus_b2 = static_cast<float>(1.0 - kBeta2);
  const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(kBeta2, t)));
  const float neg_step = static_cast<float>(-kLr / (1.0 - std::pow(kBeta1, t))), eps = static_cast<float>(kEps);
  for (int64_t i = 0; i < kNumel; ++i) {
    p[i] = p[i] * decay;                       // param.mul_(1 - lr * weight_decay)
    m[i] = m[i] + w * (g[i] - m[i]);           // exp_avg.lerp_(grad, 1 - beta1)
    v[i] = v[i] * b2;                          // exp_avg_sq.mul_(beta2)
    v[i] = v[i] + one_minus_b2 * g[i] * g[i];  // .addcmul_(grad, grad, value=1 - beta2)
    const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    p[i] = p[i] + neg_step * m[i] / denom;  // param.addcdiv_(exp_avg, denom, value=-step_size)
  }
}

inline constexpr int kSteps = 50;

// The trainer alone: one process, the whole global batch, its own AdamW for kSteps steps. Returns the final
// parameters and each step's loss before the update.
inline std::vector<float> ReferenceRun(std::vector<float>* loss) {
  std::vector<float> p(kNumel), g(kNumel), m(kNumel, 0), v(kNumel, 0);
  loss->assign(kSteps, 0.0f);
  InitParams(p.data());
  for (int t = 1; t <= kSteps; ++t) {
    (*loss)[t - 1] = ForwardBackward(p.data(), g.data(), t, 0, kBatch);
    OwnAdamW(p.data(), g.data(), m.data(), v.data(), t);
  }
  return p;
}

// ‖a - b‖ / ‖b‖ over the first kNumel elements (in double): "1e-6 relative" for a whole parameter vector.
inline double RelativeDifference(const float* a, const std::vector<float>& b) {
  double diff2 = 0, norm2 = 0;
  for (int64_t i = 0; i < kNumel; ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    diff2 += d * d;
    norm2 += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff2 / norm2);
}

}  // namespace zero::testing::flat_mlp
