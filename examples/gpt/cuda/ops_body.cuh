// examples/gpt/cuda/ops_body.cuh — the per-thread work of the GPT's CUDA kernels, as plain functions that also
// compile (and run) on the host.
//
//   // one work item per element, row or column; the kernel is a grid-stride loop over op.size() items:
//   body::GeluForwardOp op{d_x, n, d_y};
//   GridStrideKernel<<<blocks, threads, 0, stream>>>(op);           // device (device_exec.cuh)
//   for (tid...) body::GridStride(op, tid, nthreads);               // host emulation (tests/gpt)
//
// Every op is an aggregate of pointers and sizes with `size()` (the number of independent work items) and
// `operator()(i)` (item i). An item writes only its own outputs and never reads another item's outputs, so any
// assignment of items to threads gives the same bits; the emulation test runs simulated grids in both thread
// orders to check that claim.
//
// The arithmetic mirrors examples/gpt/ops.cc operation by operation, in the same loop order and with the same
// double accumulators, so on the host these bodies reproduce the CPU ops bit for bit (the emulation test checks
// it). On the device the results differ by a few ulps: CUDA's expf / tanhf are not glibc's (<= 2 ulp) and nvcc
// contracts a*b+c into FMAs. Per-row work (layernorm statistics, softmax rows) runs on ONE thread per row,
// like the CPU loop: simple and deterministic, fast enough for this example's widths (C, T, V of a few
// hundred), slow for GPT-2-sized vocabularies, where a block-per-row reduction would be the next step.
//
// Matrix products are not here: they go to cuBLAS. GemmCall below is the bridge — a row-major product (the
// form ops.cc passes to cblas) rewritten as cuBLAS's column-major call, as plain data, so the host emulation can
// execute exactly the arguments the device passes to cublasSgemm(StridedBatched).
//
// Free of CUDA headers on purpose: compiled by g++ (no __CUDACC__), ZERO_GPT_HD is plain `inline`.
#pragma once

#include <math.h>  // defines: expf, tanhf, log, sqrt for host and (through nvcc's own headers) device

#include <cstdint>
#include <limits>

#include "gpt/ops.h"  // defines: ops::kLayerNormEps

#if defined(__CUDACC__)
#define ZERO_GPT_HD __host__ __device__ __forceinline__
#else
#define ZERO_GPT_HD inline
#endif

namespace zero::gpt::cuda::body {

// GELU constants of ops.cc (tanh approximation).
inline constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluCubic = 0.044715f;

// The grid-stride loop every kernel runs: thread `tid` of `nthreads` takes items tid, tid + nthreads, ...
template <class Op>
ZERO_GPT_HD void GridStride(const Op& op, int64_t tid, int64_t nthreads) {
  const int64_t n = op.size();
  for (int64_t i = tid; i < n; i += nthreads) op(i);
}

// Written where an id is out of range, since a kernel cannot abort the way the CPU code's ZERO_CHECK does.
ZERO_GPT_HD float QuietNaN() {
#ifdef __CUDA_ARCH__
  return __int_as_float(0x7FC00000);
#else
  return std::numeric_limits<float>::quiet_NaN();
#endif
}

// std::max(a, b) as the CPU code uses it: (a < b) ? b : a.
ZERO_GPT_HD float MaxF(float a, float b) { return a < b ? b : a; }

// ---------------------------------------------------------------------------------------------------------
// Element-wise ops: one item per element.

// y = a + b (y may alias a or b).
struct ResidualOp {
  const float* a;
  const float* b;
  int64_t n;
  float* y;
  ZERO_GPT_HD int64_t size() const { return n; }
  ZERO_GPT_HD void operator()(int64_t i) const { y[i] = a[i] + b[i]; }
};

ZERO_GPT_HD float GeluForward(float v) { return 0.5f * v * (1.0f + tanhf(kGeluScale * (v + kGeluCubic * v * v * v))); }

// y = gelu(x) (y may alias x).
struct GeluForwardOp {
  const float* x;
  int64_t n;
  float* y;
  ZERO_GPT_HD int64_t size() const { return n; }
  ZERO_GPT_HD void operator()(int64_t i) const { y[i] = GeluForward(x[i]); }
};

// dx = dy * gelu'(x), x the forward input (dx may alias dy).
struct GeluBackwardOp {
  const float* dy;
  const float* x;
  int64_t n;
  float* dx;
  ZERO_GPT_HD int64_t size() const { return n; }
  ZERO_GPT_HD void operator()(int64_t i) const {
    const float v = x[i];
    const float t = tanhf(kGeluScale * (v + kGeluCubic * v * v * v));
    const float local = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
    dx[i] = dy[i] * local;
  }
};

// y[n, o] = b[o]: seeds a matmul's output with its bias so the GEMM adds the product with beta = 1, as ops.cc.
struct BiasBroadcastOp {
  const float* b;
  int64_t N;
  int64_t OC;
  float* y;
  ZERO_GPT_HD int64_t size() const { return N * OC; }
  ZERO_GPT_HD void operator()(int64_t i) const { y[i] = b[i % OC]; }
};

// ---------------------------------------------------------------------------------------------------------
// Column ops: one item per column, rows visited in order 0..N-1 (the CPU's order), so no atomics are needed
// and the sum is the same on every run.

// db[o] += sum over rows of dy[n, o], summed in double.
struct BiasGradOp {
  const float* dy;
  int64_t N;
  int64_t OC;
  float* db;
  ZERO_GPT_HD int64_t size() const { return OC; }
  ZERO_GPT_HD void operator()(int64_t o) const {
    double sum = 0.0;
    for (int64_t n = 0; n < N; ++n) sum += dy[n * OC + o];
    db[o] += static_cast<float>(sum);
  }
};

// ---------------------------------------------------------------------------------------------------------
// Layernorm.

// mean[n], rstd[n] of row n of x[N, C] (biased variance, double accumulators, as ops.cc).
struct LayerNormStatsOp {
  const float* x;
  int64_t N;
  int64_t C;
  float* mean;
  float* rstd;
  ZERO_GPT_HD int64_t size() const { return N; }
  ZERO_GPT_HD void operator()(int64_t n) const {
    const float* xr = x + n * C;
    double sum = 0.0;
    for (int64_t i = 0; i < C; ++i) sum += xr[i];
    const double m = sum / C;
    double var = 0.0;
    for (int64_t i = 0; i < C; ++i) {
      const double d = xr[i] - m;
      var += d * d;
    }
    const double s = 1.0 / sqrt(var / C + ops::kLayerNormEps);
    mean[n] = static_cast<float>(m);
    rstd[n] = static_cast<float>(s);
  }
};

// y[n, i] = (x[n, i] - mean[n]) * rstd[n] * w[i] + b[i], after LayerNormStatsOp (y may alias x).
struct LayerNormApplyOp {
  const float* x;
  const float* w;
  const float* b;
  const float* mean;
  const float* rstd;
  int64_t N;
  int64_t C;
  float* y;
  ZERO_GPT_HD int64_t size() const { return N * C; }
  ZERO_GPT_HD void operator()(int64_t j) const {
    const int64_t n = j / C;
    const int64_t i = j - n * C;
    y[j] = (x[j] - mean[n]) * rstd[n] * w[i] + b[i];
  }
};

// Backward, input half: one item per row, dx[n, :] += rstd * (g - mean(g) - norm * mean(g * norm)), g = dy * w.
struct LayerNormBackwardInputOp {
  const float* dy;
  const float* x;
  const float* w;
  const float* mean;
  const float* rstd;
  int64_t N;
  int64_t C;
  float* dx;
  ZERO_GPT_HD int64_t size() const { return N; }
  ZERO_GPT_HD void operator()(int64_t n) const {
    const float* dyr = dy + n * C;
    const float* xr = x + n * C;
    const float m = mean[n];
    const float s = rstd[n];
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
      dxr[i] += (g - g_mean - norm * gn_mean) * s;
    }
  }
};

// Backward, parameter half: one item per column i, rows in order, accumulated in float straight into dw / db
// exactly as the CPU's row loop does (db[i] += dy; dw[i] += norm * dy, row after row).
struct LayerNormBackwardParamOp {
  const float* dy;
  const float* x;
  const float* mean;
  const float* rstd;
  int64_t N;
  int64_t C;
  float* dw;
  float* db;
  ZERO_GPT_HD int64_t size() const { return C; }
  ZERO_GPT_HD void operator()(int64_t i) const {
    float dwi = dw[i];
    float dbi = db[i];
    for (int64_t n = 0; n < N; ++n) {
      const float d = dy[n * C + i];
      const float norm = (x[n * C + i] - mean[n]) * rstd[n];
      dbi += d;
      dwi += norm * d;
    }
    dw[i] = dwi;
    db[i] = dbi;
  }
};

// ---------------------------------------------------------------------------------------------------------
// Softmax + cross-entropy.

// Row n: probs[n, :] = softmax(logits[n, :]) (probs may alias logits) and row_loss[n] = logsumexp - logit of
// the target, in double. A target outside [0, V) gives row_loss NaN (the CPU aborts instead).
struct CrossEntropyForwardOp {
  const float* logits;
  const int32_t* targets;
  int64_t N;
  int64_t V;
  float* probs;
  double* row_loss;
  ZERO_GPT_HD int64_t size() const { return N; }
  ZERO_GPT_HD void operator()(int64_t n) const {
    const float* lr = logits + n * V;
    float* pr = probs + n * V;
    const int32_t target = targets[n];
    const bool valid = target >= 0 && target < V;
    float mx = lr[0];
    for (int64_t v = 1; v < V; ++v) mx = MaxF(mx, lr[v]);
    const float target_logit = valid ? lr[target] : 0.0f;  // read before probs (may alias logits) overwrites it
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) {
      pr[v] = expf(lr[v] - mx);
      sum += pr[v];
    }
    row_loss[n] = valid ? log(sum) + mx - target_logit : static_cast<double>(QuietNaN());
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t v = 0; v < V; ++v) pr[v] *= inv;
  }
};

// *loss = mean of row_loss[0, N), summed in row order in double: one item.
struct CrossEntropyMeanOp {
  const double* row_loss;
  int64_t N;
  float* loss;
  ZERO_GPT_HD int64_t size() const { return 1; }
  ZERO_GPT_HD void operator()(int64_t) const {
    double sum = 0.0;
    for (int64_t n = 0; n < N; ++n) sum += row_loss[n];
    *loss = static_cast<float>(sum / static_cast<double>(N));
  }
};

// dlogits = (probs - onehot(target)) / N per element (dlogits may alias probs).
struct CrossEntropyBackwardOp {
  const float* probs;
  const int32_t* targets;
  int64_t N;
  int64_t V;
  float* dlogits;
  ZERO_GPT_HD int64_t size() const { return N * V; }
  ZERO_GPT_HD void operator()(int64_t j) const {
    const float inv_n = 1.0f / static_cast<float>(N);
    const int64_t n = j / V;
    const int64_t v = j - n * V;
    float d = probs[j] * inv_n;
    if (v == targets[n]) d -= inv_n;
    dlogits[j] = d;
  }
};

// ---------------------------------------------------------------------------------------------------------
// Embeddings. tokens is [B, T] row-major, N = B*T rows.

// out[row, c] = wte[tokens[row], c] + wpe[row % T, c]; a token outside [0, V) gives a NaN row.
struct EmbeddingForwardOp {
  const float* wte;
  const float* wpe;
  const int32_t* tokens;
  int64_t N;
  int64_t T;
  int64_t C;
  int64_t V;
  float* out;
  ZERO_GPT_HD int64_t size() const { return N * C; }
  ZERO_GPT_HD void operator()(int64_t j) const {
    const int64_t row = j / C;
    const int64_t c = j - row * C;
    const int64_t t = row % T;
    const int32_t tok = tokens[row];
    out[j] = (tok >= 0 && tok < V) ? wte[tok * C + c] + wpe[t * C + c] : QuietNaN();
  }
};

// dwte[v, c] += dx[row, c] for every row whose token is v, rows in order: one item per (v, c), so repeated
// tokens accumulate in the CPU's order without atomics. Each item scans all N tokens (V*C*N reads of a
// broadcast int: cheap at this example's vocab of 256; a large vocabulary would want rows bucketed by token
// first). Tokens outside [0, V) match no v and are ignored.
struct EmbeddingBackwardWteOp {
  const float* dx;
  const int32_t* tokens;
  int64_t N;
  int64_t C;
  int64_t V;
  float* dwte;
  ZERO_GPT_HD int64_t size() const { return V * C; }
  ZERO_GPT_HD void operator()(int64_t j) const {
    const int64_t v = j / C;
    const int64_t c = j - v * C;
    float acc = dwte[j];
    for (int64_t row = 0; row < N; ++row) {
      if (tokens[row] == v) acc += dx[row * C + c];
    }
    dwte[j] = acc;
  }
};

// dwpe[t, c] += dx[b*T + t, c] over b in order: one item per (t, c) of the first T positions.
struct EmbeddingBackwardWpeOp {
  const float* dx;
  int64_t B;
  int64_t T;
  int64_t C;
  float* dwpe;
  ZERO_GPT_HD int64_t size() const { return T * C; }
  ZERO_GPT_HD void operator()(int64_t j) const {
    float acc = dwpe[j];
    for (int64_t b = 0; b < B; ++b) acc += dx[b * T * C + j];
    dwpe[j] = acc;
  }
};

// ---------------------------------------------------------------------------------------------------------
// Causal attention softmax, one item per row r of att viewed as [rows = B*NH*T, T]; the row's query position
// is t = r % T.

// In place: row[t2] = softmax over t2 <= t of scale * row[t2] (the unscaled scores q.k), zeros for t2 > t.
struct CausalSoftmaxOp {
  float* att;
  int64_t rows;
  int64_t T;
  float scale;
  ZERO_GPT_HD int64_t size() const { return rows; }
  ZERO_GPT_HD void operator()(int64_t r) const {
    float* row = att + r * T;
    const int64_t t = r % T;
    float mx = row[0] * scale;
    for (int64_t t2 = 1; t2 <= t; ++t2) mx = MaxF(mx, row[t2] * scale);
    double sum = 0.0;
    for (int64_t t2 = 0; t2 <= t; ++t2) {
      row[t2] = expf(row[t2] * scale - mx);
      sum += row[t2];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t t2 = 0; t2 <= t; ++t2) row[t2] *= inv;
    for (int64_t t2 = t + 1; t2 < T; ++t2) row[t2] = 0.0f;
  }
};

// In place on datt (= dL/d probs on entry): datt = att * (datt - sum(att * datt)) * scale, the gradient of the
// UNSCALED scores; zeros above the diagonal (the CPU's formula and order).
struct CausalSoftmaxBackwardOp {
  const float* att;
  float* datt;
  int64_t rows;
  int64_t T;
  float scale;
  ZERO_GPT_HD int64_t size() const { return rows; }
  ZERO_GPT_HD void operator()(int64_t r) const {
    const float* arow = att + r * T;
    float* drow = datt + r * T;
    const int64_t t = r % T;
    double dot = 0.0;
    for (int64_t t2 = 0; t2 <= t; ++t2) dot += static_cast<double>(arow[t2]) * drow[t2];
    const float dotf = static_cast<float>(dot);
    for (int64_t t2 = 0; t2 <= t; ++t2) drow[t2] = arow[t2] * (drow[t2] - dotf) * scale;
    for (int64_t t2 = t + 1; t2 < T; ++t2) drow[t2] = 0.0f;
  }
};

// ---------------------------------------------------------------------------------------------------------
// GEMM calls in cuBLAS terms.

// One cublasSgemm (batch == 1) or cublasSgemmStridedBatched call, column-major:
//   C_p = alpha op(A_p) op(B_p) + beta C_p,  op(A_p) [m, k], op(B_p) [k, n], C_p [m, n], X_p = X + p * stride_x.
// As in BLAS, C is not read when beta == 0.
struct GemmCall {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  float alpha = 1.0f;
  const float* a = nullptr;
  int64_t lda = 0;
  int64_t stride_a = 0;
  const float* b = nullptr;
  int64_t ldb = 0;
  int64_t stride_b = 0;
  float beta = 0.0f;
  float* c = nullptr;
  int64_t ldc = 0;
  int64_t stride_c = 0;
  int64_t batch = 1;
};

// The row-major product ops.cc hands to cblas_sgemm(CblasRowMajor, ...):
//   C[M, N] = alpha op(A)[M, K] op(B)[K, N] + beta C   (leading dimensions lda, ldb, ldc, row-major)
// as a column-major call. Row-major memory read column-major is the transpose, so the call computes
// C^T = op(B)^T op(A)^T: the operands swap places and keep their transpose flags. The strides (for batches)
// swap with them.
inline GemmCall RowMajorGemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                             int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
                             int64_t batch = 1, int64_t stride_a = 0, int64_t stride_b = 0, int64_t stride_c = 0) {
  GemmCall g;
  g.trans_a = trans_b;
  g.trans_b = trans_a;
  g.m = N;
  g.n = M;
  g.k = K;
  g.alpha = alpha;
  g.a = B;
  g.lda = ldb;
  g.stride_a = stride_b;
  g.b = A;
  g.ldb = lda;
  g.stride_b = stride_a;
  g.beta = beta;
  g.c = C;
  g.ldc = ldc;
  g.stride_c = stride_c;
  g.batch = batch;
  return g;
}

}  // namespace zero::gpt::cuda::body
