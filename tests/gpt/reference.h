// tests/gpt/reference.h — naive double-precision reference of every GPT layer and of the whole model, written
// independently of examples/gpt (plain loops, no BLAS, no saved activations), plus central finite differences.
// The float kernels are checked against these: forward values directly, backward against numerical gradients
// of the reference (llm.c's test_gpt2 checks its kernels against a reference the same way).
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gpt/model.h"

namespace zero::gpt::testing {

using Vec = std::vector<double>;

inline Vec ToDouble(const float* p, int64_t n) { return Vec(p, p + n); }
inline std::vector<float> ToFloat(const Vec& v) { return std::vector<float>(v.begin(), v.end()); }

// y[N, OC] = x[N, IC] w[IC, OC] + b (b may be empty).
inline Vec RefMatmul(const Vec& x, const Vec& w, const Vec& b, int N, int IC, int OC) {
  Vec y(static_cast<size_t>(N) * OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = b.empty() ? 0.0 : b[o];
      for (int i = 0; i < IC; ++i) s += x[n * IC + i] * w[i * OC + o];
      y[n * OC + o] = s;
    }
  return y;
}

// logits[N, V] = x[N, C] wte[V, C]^T.
inline Vec RefTiedHead(const Vec& x, const Vec& wte, int N, int C, int V) {
  Vec y(static_cast<size_t>(N) * V);
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < V; ++v) {
      double s = 0.0;
      for (int i = 0; i < C; ++i) s += x[n * C + i] * wte[v * C + i];
      y[n * V + v] = s;
    }
  return y;
}

inline Vec RefLayerNorm(const Vec& x, const Vec& w, const Vec& b, int N, int C) {
  Vec y(x.size());
  for (int n = 0; n < N; ++n) {
    double m = 0.0;
    for (int i = 0; i < C; ++i) m += x[n * C + i];
    m /= C;
    double var = 0.0;
    for (int i = 0; i < C; ++i) var += (x[n * C + i] - m) * (x[n * C + i] - m);
    var /= C;
    const double rstd = 1.0 / std::sqrt(var + 1e-5);
    for (int i = 0; i < C; ++i) y[n * C + i] = (x[n * C + i] - m) * rstd * w[i] + b[i];
  }
  return y;
}

inline Vec RefGelu(const Vec& x) {
  Vec y(x.size());
  const double k = std::sqrt(2.0 / M_PI);
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = 0.5 * x[i] * (1.0 + std::tanh(k * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
  return y;
}

// Causal multi-head attention over qkv[B, T, 3C] (q | k | v, heads contiguous inside each); y[B, T, C].
inline Vec RefAttention(const Vec& qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  Vec y(static_cast<size_t>(B) * T * C, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const double* q = &qkv[(static_cast<size_t>(b) * T + t) * 3 * C + h * hs];
        Vec s(t + 1);
        double mx = -1e300;
        for (int t2 = 0; t2 <= t; ++t2) {
          const double* k = &qkv[(static_cast<size_t>(b) * T + t2) * 3 * C + C + h * hs];
          double dot = 0.0;
          for (int i = 0; i < hs; ++i) dot += q[i] * k[i];
          s[t2] = dot / std::sqrt(static_cast<double>(hs));
          mx = std::max(mx, s[t2]);
        }
        double sum = 0.0;
        for (auto& v : s) sum += (v = std::exp(v - mx));
        for (int t2 = 0; t2 <= t; ++t2) {
          const double* v = &qkv[(static_cast<size_t>(b) * T + t2) * 3 * C + 2 * C + h * hs];
          for (int i = 0; i < hs; ++i) y[(static_cast<size_t>(b) * T + t) * C + h * hs + i] += s[t2] / sum * v[i];
        }
      }
  return y;
}

// Mean over rows of -log softmax(logits)[target].
inline double RefCrossEntropy(const Vec& logits, const std::vector<int32_t>& targets, int N, int V) {
  double total = 0.0;
  for (int n = 0; n < N; ++n) {
    double mx = -1e300;
    for (int v = 0; v < V; ++v) mx = std::max(mx, logits[n * V + v]);
    double sum = 0.0;
    for (int v = 0; v < V; ++v) sum += std::exp(logits[n * V + v] - mx);
    total += std::log(sum) + mx - logits[n * V + targets[n]];
  }
  return total / N;
}

// Parameters of a whole model in double, one flat vector per unit (root, h.0, ...) packed in spec order.
struct RefParams {
  GptConfig cfg;
  std::vector<Vec> units;

  // Offset of parameter `name` inside unit `u`.
  int64_t Offset(int u, const std::string& name) const {
    int64_t off = 0;
    for (const auto& s : u == 0 ? RootParams(cfg) : BlockParams(cfg)) {
      if (s.name == name) return off;
      off += s.numel();
    }
    return -1;
  }
  Vec Get(int u, const std::string& name) const {
    const auto specs = u == 0 ? RootParams(cfg) : BlockParams(cfg);
    for (const auto& s : specs)
      if (s.name == name)
        return Vec(units[u].begin() + Offset(u, name), units[u].begin() + Offset(u, name) + s.numel());
    return {};
  }
};

// Mean cross-entropy of the whole model in double: embeddings, pre-LN blocks, final LN, tied head.
inline double RefModelLoss(const RefParams& p, const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
                           int B, int T) {
  const GptConfig& cfg = p.cfg;
  const int C = cfg.channels;
  const int N = B * T;
  const Vec wte = p.Get(0, "wte");
  const Vec wpe = p.Get(0, "wpe");
  Vec x(static_cast<size_t>(N) * C);
  for (int n = 0; n < N; ++n)
    for (int i = 0; i < C; ++i) x[n * C + i] = wte[tokens[n] * C + i] + wpe[(n % T) * C + i];
  for (int l = 1; l <= cfg.layers; ++l) {
    const Vec ln1 = RefLayerNorm(x, p.Get(l, "ln1_w"), p.Get(l, "ln1_b"), N, C);
    const Vec qkv = RefMatmul(ln1, p.Get(l, "qkv_w"), p.Get(l, "qkv_b"), N, C, 3 * C);
    const Vec att = RefAttention(qkv, B, T, C, cfg.heads);
    const Vec proj = RefMatmul(att, p.Get(l, "attn_proj_w"), p.Get(l, "attn_proj_b"), N, C, C);
    for (size_t i = 0; i < x.size(); ++i) x[i] += proj[i];
    const Vec ln2 = RefLayerNorm(x, p.Get(l, "ln2_w"), p.Get(l, "ln2_b"), N, C);
    const Vec h = RefGelu(RefMatmul(ln2, p.Get(l, "fc_w"), p.Get(l, "fc_b"), N, C, 4 * C));
    const Vec mlp = RefMatmul(h, p.Get(l, "fc_proj_w"), p.Get(l, "fc_proj_b"), N, 4 * C, C);
    for (size_t i = 0; i < x.size(); ++i) x[i] += mlp[i];
  }
  const Vec lnf = RefLayerNorm(x, p.Get(0, "lnf_w"), p.Get(0, "lnf_b"), N, C);
  return RefCrossEntropy(RefTiedHead(lnf, wte, N, C, cfg.vocab), targets, N, cfg.vocab);
}

// d f / d *x by central differences (x restored afterwards).
inline double CentralDiff(const std::function<double()>& f, double* x, double eps = 1e-6) {
  const double old = *x;
  *x = old + eps;
  const double fp = f();
  *x = old - eps;
  const double fm = f();
  *x = old;
  return (fp - fm) / (2 * eps);
}

// Numerical gradient of f with respect to every element of *x.
inline Vec NumericalGrad(const std::function<double()>& f, Vec* x, double eps = 1e-6) {
  Vec g(x->size());
  for (size_t i = 0; i < x->size(); ++i) g[i] = CentralDiff(f, &(*x)[i], eps);
  return g;
}

// sum(r .* y): contracting an output with a fixed random cotangent turns a vector function into the scalar
// whose gradient is the vector-Jacobian product that backward computes for dy = r.
inline double Dot(const Vec& r, const Vec& y) {
  double s = 0.0;
  for (size_t i = 0; i < r.size(); ++i) s += r[i] * y[i];
  return s;
}

}  // namespace zero::gpt::testing
