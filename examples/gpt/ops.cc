// CPU kernels of the reference GPT. Matrix products go through cblas_sgemm (OpenBLAS); everything else is
// plain loops in a fixed order. Per-row reductions (layernorm statistics, softmax sums, bias gradients) are
// accumulated in double: it costs little next to the matmuls and keeps the float results close to the
// double-precision references the tests compare against.
#include "gpt/ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "zero/status.h"

namespace zero::gpt::ops {
namespace {

// cblas takes int dimensions (OpenBLAS built without ILP64); every product in this model is far below 2^31.
int BlasDim(int64_t v) {
  ZERO_CHECK(v >= 0 && v <= std::numeric_limits<int>::max()) << "matrix dimension " << v << " overflows int";
  return static_cast<int>(v);
}

// Row-major C[M, N] = alpha * op(A) op(B) + beta * C with op(A) [M, K], op(B) [K, N].
void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, BlasDim(M),
              BlasDim(N), BlasDim(K), alpha, A, BlasDim(lda), B, BlasDim(ldb), beta, C, BlasDim(ldc));
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

}  // namespace

// ---- matmul ---------------------------------------------------------------------------------------------

void MatmulForward(const float* x, const float* w, const float* b, int64_t N, int64_t IC, int64_t OC, float* y) {
  float beta = 0.0f;
  if (b != nullptr) {
    // Seed y with the bias and let sgemm add the product (beta = 1): one pass over y instead of two.
    for (int64_t n = 0; n < N; ++n) std::memcpy(y + n * OC, b, sizeof(float) * OC);
    beta = 1.0f;
  }
  Gemm(false, false, N, OC, IC, 1.0f, x, IC, w, OC, beta, y, OC);
}

void MatmulBackward(const float* dy, const float* x, const float* w, int64_t N, int64_t IC, int64_t OC, float* dx,
                    float* dw, float* db) {
  if (dx != nullptr) Gemm(false, true, N, IC, OC, 1.0f, dy, OC, w, OC, 0.0f, dx, IC);
  Gemm(true, false, IC, OC, N, 1.0f, x, IC, dy, OC, 1.0f, dw, OC);
  if (db != nullptr) {
    std::vector<double> sum(OC, 0.0);
    for (int64_t n = 0; n < N; ++n) {
      const float* row = dy + n * OC;
      for (int64_t o = 0; o < OC; ++o) sum[o] += row[o];
    }
    for (int64_t o = 0; o < OC; ++o) db[o] += static_cast<float>(sum[o]);
  }
}

void TiedHeadForward(const float* x, const float* wte, int64_t N, int64_t C, int64_t V, float* logits) {
  Gemm(false, true, N, V, C, 1.0f, x, C, wte, C, 0.0f, logits, V);
}

void TiedHeadBackward(const float* dlogits, const float* x, const float* wte, int64_t N, int64_t C, int64_t V,
                      float* dx, float* dwte) {
  Gemm(false, false, N, C, V, 1.0f, dlogits, V, wte, C, 0.0f, dx, C);
  Gemm(true, false, V, C, N, 1.0f, dlogits, V, x, C, 1.0f, dwte, C);
}

// ---- layernorm ------------------------------------------------------------------------------------------

void LayerNormForward(const float* x, const float* w, const float* b, int64_t N, int64_t C, float* y, float* mean,
                      float* rstd) {
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    double sum = 0.0;
    for (int64_t i = 0; i < C; ++i) sum += xr[i];
    const double m = sum / C;
    double var = 0.0;
    for (int64_t i = 0; i < C; ++i) {
      const double d = xr[i] - m;
      var += d * d;
    }
    const double s = 1.0 / std::sqrt(var / C + kLayerNormEps);
    const float mf = static_cast<float>(m);
    const float sf = static_cast<float>(s);
    float* yr = y + n * C;
    for (int64_t i = 0; i < C; ++i) yr[i] = (xr[i] - mf) * sf * w[i] + b[i];
    mean[n] = mf;
    rstd[n] = sf;
  }
}

void LayerNormBackward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd, int64_t N,
                       int64_t C, float* dx, float* dw, float* db) {
  for (int64_t n = 0; n < N; ++n) {
    const float* dyr = dy + n * C;
    const float* xr = x + n * C;
    const float m = mean[n];
    const float s = rstd[n];
    // dL/dx = rstd * (g - mean(g) - norm * mean(g * norm)) with g = dy * w: the two means are the
    // projections that layernorm's centering and scaling remove.
    double g_sum = 0.0;
    double gn_sum = 0.0;
    for (int64_t i = 0; i < C; ++i) {
      const float norm = (xr[i] - m) * s;
      const float g = dyr[i] * w[i];
      g_sum += g;
      gn_sum += static_cast<double>(g) * norm;
    }
    const float g_mean = static_cast<float>(g_sum / C);
    const float gn_mean = static_cast<float>(gn_sum / C);
    float* dxr = dx + n * C;
    for (int64_t i = 0; i < C; ++i) {
      const float norm = (xr[i] - m) * s;
      const float g = dyr[i] * w[i];
      db[i] += dyr[i];
      dw[i] += norm * dyr[i];
      dxr[i] += (g - g_mean - norm * gn_mean) * s;
    }
  }
}

// ---- GELU -----------------------------------------------------------------------------------------------

void GeluForward(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + std::tanh(kGeluScale * (v + kGeluCubic * v * v * v)));
  }
}

void GeluBackward(const float* dy, const float* x, int64_t n, float* dx) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float t = std::tanh(kGeluScale * (v + kGeluCubic * v * v * v));
    // sech^2 written as 1 - tanh^2 so that large |x| gives 0 instead of overflowing cosh.
    const float local = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
    dx[i] = dy[i] * local;
  }
}

// ---- causal self-attention -------------------------------------------------------------------------------

void AttentionForward(const float* qkv, int B, int T, int C, int NH, float* att, float* y) {
  const int hs = C / NH;
  const int64_t C3 = 3LL * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const float* q = qkv + static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* a = att + (static_cast<int64_t>(b) * NH + h) * T * T;
      // Scores for the full T x T square (the masked half is recomputed and discarded: sgemm on the square is
      // still faster than a triangular loop at these sizes).
      Gemm(false, true, T, T, hs, scale, q, C3, k, C3, 0.0f, a, T);
      for (int t = 0; t < T; ++t) {
        float* row = a + static_cast<int64_t>(t) * T;
        float mx = row[0];
        for (int t2 = 1; t2 <= t; ++t2) mx = std::max(mx, row[t2]);
        double sum = 0.0;
        for (int t2 = 0; t2 <= t; ++t2) {
          row[t2] = std::exp(row[t2] - mx);
          sum += row[t2];
        }
        const float inv = static_cast<float>(1.0 / sum);
        for (int t2 = 0; t2 <= t; ++t2) row[t2] *= inv;
        for (int t2 = t + 1; t2 < T; ++t2) row[t2] = 0.0f;
      }
      float* out = y + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * hs;
      Gemm(false, false, T, hs, T, 1.0f, a, T, v, C3, 0.0f, out, C);
    }
  }
}

void AttentionBackward(const float* dy, const float* qkv, const float* att, int B, int T, int C, int NH, float* dqkv,
                       float* scratch) {
  const int hs = C / NH;
  const int64_t C3 = 3LL * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const int64_t head_off = static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * hs;
      const float* q = qkv + head_off;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv + head_off;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* a = att + (static_cast<int64_t>(b) * NH + h) * T * T;
      const float* dout = dy + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * hs;
      // y = a v  ->  da = dy v^T, dv = a^T dy. Each (b, h) owns its own slice of dqkv, so beta = 0 writes it.
      Gemm(false, true, T, T, hs, 1.0f, dout, C, v, C3, 0.0f, scratch, T);
      Gemm(true, false, T, hs, T, 1.0f, a, T, dout, C, 0.0f, dv, C3);
      // Softmax backward per row, in place: dpre = a * (da - sum(a * da)); folded with the score scale.
      // Masked entries have a = 0, so they get exactly zero gradient.
      for (int t = 0; t < T; ++t) {
        const float* arow = a + static_cast<int64_t>(t) * T;
        float* drow = scratch + static_cast<int64_t>(t) * T;
        double dot = 0.0;
        for (int t2 = 0; t2 <= t; ++t2) dot += static_cast<double>(arow[t2]) * drow[t2];
        const float dotf = static_cast<float>(dot);
        for (int t2 = 0; t2 <= t; ++t2) drow[t2] = arow[t2] * (drow[t2] - dotf) * scale;
        for (int t2 = t + 1; t2 < T; ++t2) drow[t2] = 0.0f;
      }
      // pre = scale q k^T  ->  dq = dpre k, dk = dpre^T q (scale already folded into dpre).
      Gemm(false, false, T, hs, T, 1.0f, scratch, T, k, C3, 0.0f, dq, C3);
      Gemm(true, false, T, hs, T, 1.0f, scratch, T, q, C3, 0.0f, dk, C3);
    }
  }
}

// ---- residual --------------------------------------------------------------------------------------------

void ResidualForward(const float* a, const float* b, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

// ---- softmax + cross-entropy -----------------------------------------------------------------------------

float SoftmaxCrossEntropyForward(const float* logits, const int32_t* targets, int64_t N, int64_t V, float* probs) {
  double loss_sum = 0.0;
  for (int64_t n = 0; n < N; ++n) {
    const float* lr = logits + n * V;
    float* pr = probs + n * V;
    const int32_t target = targets[n];
    ZERO_CHECK(target >= 0 && target < V) << "target " << target << " at row " << n << " outside [0, " << V << ")";
    float mx = lr[0];
    for (int64_t v = 1; v < V; ++v) mx = std::max(mx, lr[v]);
    const float target_logit = lr[target];  // read before probs (which may alias logits) overwrites it
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) {
      pr[v] = std::exp(lr[v] - mx);
      sum += pr[v];
    }
    // -log softmax[target] as log-sum-exp - logit, which stays accurate where probs[target] underflows.
    loss_sum += std::log(sum) + mx - target_logit;
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t v = 0; v < V; ++v) pr[v] *= inv;
  }
  return static_cast<float>(loss_sum / static_cast<double>(N));
}

void SoftmaxCrossEntropyBackward(const float* probs, const int32_t* targets, int64_t N, int64_t V, float* dlogits) {
  const float inv_n = 1.0f / static_cast<float>(N);
  for (int64_t n = 0; n < N; ++n) {
    const float* pr = probs + n * V;
    float* dr = dlogits + n * V;
    for (int64_t v = 0; v < V; ++v) dr[v] = pr[v] * inv_n;
    dr[targets[n]] -= inv_n;
  }
}

}  // namespace zero::gpt::ops
