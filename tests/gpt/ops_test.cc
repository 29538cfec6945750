// Every GPT kernel against the double reference: forward values, and backward against numerical gradients of
// sum(r .* forward(inputs)) for a random cotangent r (so the float backward with dy = r must match).
#include "gpt/ops.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gpt/model.h"
#include "gpt/reference.h"
#include "gtest/gtest.h"

namespace zero::gpt {
namespace {

using testing::Vec;

// Random doubles that are exactly representable as floats, so both precisions see the same inputs.
Vec RandomVec(std::mt19937_64& rng, size_t n, double stddev, double mean = 0.0) {
  std::normal_distribution<double> dist(mean, stddev);
  Vec v(n);
  for (auto& x : v) x = static_cast<float>(dist(rng));
  return v;
}

// max |a - ref| <= rel * max |ref| + abs: a tensor-wide relative error, robust to elements near zero.
void ExpectClose(const std::vector<float>& a, const Vec& ref, double rel, const std::string& what, double abs = 1e-7) {
  ASSERT_EQ(a.size(), ref.size()) << what;
  double err = 0.0;
  double scale = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::abs(a[i] - ref[i]);
    if (e > err) {
      err = e;
      worst = i;
    }
    scale = std::max(scale, std::abs(ref[i]));
  }
  EXPECT_GT(scale, 0.0) << what << ": reference is all zeros, the check would be vacuous";
  EXPECT_LE(err, rel * scale + abs) << what << ": worst element " << worst << " = " << a[worst] << " vs " << ref[worst]
                                    << " (max |ref| " << scale << ")";
}

TEST(GptOpsTest, MatmulForwardBackwardMatchReference) {
  std::mt19937_64 rng(1);
  const int N = 6, IC = 5, OC = 7;
  Vec x = RandomVec(rng, N * IC, 1.0), w = RandomVec(rng, IC * OC, 0.5), b = RandomVec(rng, OC, 0.5);
  const Vec r = RandomVec(rng, N * OC, 1.0);
  for (bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "bias" : "no bias");
    const Vec bias = with_bias ? b : Vec{};
    std::vector<float> xf = testing::ToFloat(x), wf = testing::ToFloat(w), bf = testing::ToFloat(b), y(N * OC);
    ops::MatmulForward(xf.data(), wf.data(), with_bias ? bf.data() : nullptr, N, IC, OC, y.data());
    ExpectClose(y, testing::RefMatmul(x, w, bias, N, IC, OC), 1e-6, "y");

    // Gradients accumulate into dw / db: start them at a known value and subtract it afterwards.
    std::vector<float> rf = testing::ToFloat(r), dx(N * IC, 7.0f), dw(IC * OC, 1.0f), db(OC, -2.0f);
    ops::MatmulBackward(rf.data(), xf.data(), wf.data(), N, IC, OC, dx.data(), dw.data(),
                        with_bias ? db.data() : nullptr);
    for (auto& v : dw) v -= 1.0f;
    Vec xm = x, wm = w, bm = bias;
    auto loss = [&] { return testing::Dot(r, testing::RefMatmul(xm, wm, bm, N, IC, OC)); };
    ExpectClose(dx, testing::NumericalGrad(loss, &xm), 1e-5, "dx (written, not accumulated)");
    ExpectClose(dw, testing::NumericalGrad(loss, &wm), 1e-5, "dw");
    if (with_bias) {
      for (auto& v : db) v += 2.0f;
      ExpectClose(db, testing::NumericalGrad(loss, &bm), 1e-5, "db");
    } else {
      EXPECT_EQ(db, std::vector<float>(OC, -2.0f)) << "db touched without a bias";
    }
  }
}

TEST(GptOpsTest, TiedHeadForwardBackwardMatchReference) {
  std::mt19937_64 rng(2);
  const int N = 5, C = 6, V = 9;
  Vec x = RandomVec(rng, N * C, 1.0), wte = RandomVec(rng, V * C, 0.5);
  const Vec r = RandomVec(rng, N * V, 1.0);
  std::vector<float> xf = testing::ToFloat(x), wf = testing::ToFloat(wte), logits(N * V);
  ops::TiedHeadForward(xf.data(), wf.data(), N, C, V, logits.data());
  ExpectClose(logits, testing::RefTiedHead(x, wte, N, C, V), 1e-6, "logits");
  std::vector<float> rf = testing::ToFloat(r), dx(N * C), dwte(V * C, 0.0f);
  ops::TiedHeadBackward(rf.data(), xf.data(), wf.data(), N, C, V, dx.data(), dwte.data());
  auto loss = [&] { return testing::Dot(r, testing::RefTiedHead(x, wte, N, C, V)); };
  ExpectClose(dx, testing::NumericalGrad(loss, &x), 1e-5, "dx");
  ExpectClose(dwte, testing::NumericalGrad(loss, &wte), 1e-5, "dwte");
}

TEST(GptOpsTest, LayerNormForwardBackwardMatchReference) {
  std::mt19937_64 rng(3);
  const int N = 4, C = 10;
  Vec x = RandomVec(rng, N * C, 2.0, 0.5), w = RandomVec(rng, C, 0.5, 1.0), b = RandomVec(rng, C, 0.5);
  const Vec r = RandomVec(rng, N * C, 1.0);
  std::vector<float> xf = testing::ToFloat(x), wf = testing::ToFloat(w), bf = testing::ToFloat(b), y(N * C), mean(N),
                     rstd(N);
  ops::LayerNormForward(xf.data(), wf.data(), bf.data(), N, C, y.data(), mean.data(), rstd.data());
  ExpectClose(y, testing::RefLayerNorm(x, w, b, N, C), 1e-5, "y");

  // dx accumulates too (callers fold the residual stream into it): start at 3 and subtract.
  std::vector<float> rf = testing::ToFloat(r), dx(N * C, 3.0f), dw(C, 0.0f), db(C, 0.0f);
  ops::LayerNormBackward(rf.data(), xf.data(), wf.data(), mean.data(), rstd.data(), N, C, dx.data(), dw.data(),
                         db.data());
  for (auto& v : dx) v -= 3.0f;
  auto loss = [&] { return testing::Dot(r, testing::RefLayerNorm(x, w, b, N, C)); };
  ExpectClose(dx, testing::NumericalGrad(loss, &x), 1e-4, "dx");
  ExpectClose(dw, testing::NumericalGrad(loss, &w), 1e-5, "dw");
  ExpectClose(db, testing::NumericalGrad(loss, &b), 1e-5, "db");
}

TEST(GptOpsTest, GeluForwardBackwardMatchReference) {
  std::mt19937_64 rng(4);
  Vec x = RandomVec(rng, 40, 2.0);
  for (double v : {-12.0, -5.0, -0.5, 0.0, 0.5, 5.0, 12.0}) x.push_back(v);  // tails where tanh saturates
  const Vec r = RandomVec(rng, x.size(), 1.0);
  std::vector<float> xf = testing::ToFloat(x), y(x.size());
  ops::GeluForward(xf.data(), xf.size(), y.data());
  ExpectClose(y, testing::RefGelu(x), 1e-6, "y");
  std::vector<float> dx = testing::ToFloat(r);
  ops::GeluBackward(dx.data(), xf.data(), dx.size(), dx.data());  // in place, as the block uses it
  for (float v : dx) ASSERT_TRUE(std::isfinite(v));
  auto loss = [&] { return testing::Dot(r, testing::RefGelu(x)); };
  ExpectClose(dx, testing::NumericalGrad(loss, &x), 1e-5, "dx");
}

TEST(GptOpsTest, AttentionForwardBackwardMatchReference) {
  std::mt19937_64 rng(5);
  const int B = 2, T = 5, C = 8, NH = 2;
  Vec qkv = RandomVec(rng, static_cast<size_t>(B) * T * 3 * C, 1.0);
  const Vec r = RandomVec(rng, static_cast<size_t>(B) * T * C, 1.0);
  std::vector<float> qf = testing::ToFloat(qkv), att(B * NH * T * T), y(B * T * C);
  ops::AttentionForward(qf.data(), B, T, C, NH, att.data(), y.data());
  ExpectClose(y, testing::RefAttention(qkv, B, T, C, NH), 1e-5, "y");
  // Saved probabilities: causal (zero above the diagonal) and each row a distribution.
  for (int bh = 0; bh < B * NH; ++bh)
    for (int t = 0; t < T; ++t) {
      double sum = 0.0;
      for (int t2 = 0; t2 < T; ++t2) {
        const float a = att[(bh * T + t) * T + t2];
        if (t2 > t) {
          EXPECT_EQ(a, 0.0f) << "future position " << t2 << " visible from " << t;
        }
        sum += a;
      }
      EXPECT_NEAR(sum, 1.0, 1e-6);
    }
  std::vector<float> rf = testing::ToFloat(r), dqkv(qf.size(), 123.0f), scratch(T * T);
  ops::AttentionBackward(rf.data(), qf.data(), att.data(), B, T, C, NH, dqkv.data(), scratch.data());
  auto loss = [&] { return testing::Dot(r, testing::RefAttention(qkv, B, T, C, NH)); };
  ExpectClose(dqkv, testing::NumericalGrad(loss, &qkv), 1e-5, "dqkv");
}

TEST(GptOpsTest, SoftmaxCrossEntropyMatchesReference) {
  std::mt19937_64 rng(6);
  const int N = 4, V = 11;
  Vec logits = RandomVec(rng, N * V, 2.0);
  logits[3] = 80.0;  // a dominant logit: log-sum-exp must not overflow
  const std::vector<int32_t> targets = {0, 10, 3, 7};
  std::vector<float> lf = testing::ToFloat(logits), probs(N * V);
  const float loss = ops::SoftmaxCrossEntropyForward(lf.data(), targets.data(), N, V, probs.data());
  EXPECT_NEAR(loss, testing::RefCrossEntropy(logits, targets, N, V), 1e-5);
  // In place (probs aliasing logits), as the head runs it, gives the same loss and probabilities.
  std::vector<float> inplace = lf;
  EXPECT_EQ(ops::SoftmaxCrossEntropyForward(inplace.data(), targets.data(), N, V, inplace.data()), loss);
  EXPECT_EQ(inplace, probs);

  std::vector<float> dlogits(N * V);
  ops::SoftmaxCrossEntropyBackward(probs.data(), targets.data(), N, V, dlogits.data());
  auto f = [&] { return testing::RefCrossEntropy(logits, targets, N, V); };
  ExpectClose(dlogits, testing::NumericalGrad(f, &logits), 1e-5, "dlogits");
}

}  // namespace
}  // namespace zero::gpt
