// examples/gpt/cuda/ops_impl.h — the GPT ops of ops_cuda.h written once, against an executor, so that the same
// composition (which kernels, which GEMMs with which leading dimensions and strides, in which order) runs on the
// device and, in CI without a GPU, in the host emulation.
//
//   DeviceExec ex(handle, stream);                                  // device_exec.cuh: kernels + cuBLAS
//   ZERO_RETURN_IF_ERROR(impl::MatmulForward(ex, d_x, d_w, d_b, N, IC, OC, d_y));
//
// An executor `Ex` provides, each returning absl::Status:
//   Grid(op)                 runs op(i) for every i in [0, op.size()) (ops_body.cuh), ordered after earlier work;
//   Gemm(const GemmCall&)    one cuBLAS-semantics (column-major, optionally strided-batched) sgemm;
//   Copy(dst, src, bytes)    a non-overlapping copy;  Zero(dst, bytes): memset 0.
// Everything is stream-ordered on the device executor; nothing here synchronizes.
//
// Argument checks return kInvalidArgument (the CPU ops in ops.h have no checks; the device path cannot abort
// mid-stream the way a ZERO_CHECK does, so it refuses bad shapes before enqueuing anything). Data-dependent
// conditions (token / target ids) cannot be checked without a host sync: see ops_body.cuh for what the kernels
// write instead.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>

#include "absl/strings/str_cat.h"
#include "gpt/cuda/ops_body.cuh"
#include "zero/status.h"

namespace zero::gpt::cuda::impl {

// ---- argument checks -------------------------------------------------------------------------------------

// Every dimension in [lo, 2^31): cuBLAS takes int dimensions, and the kernels' shapes stay within the same bound.
inline Status CheckDims(const char* op, std::initializer_list<int64_t> dims, int64_t lo = 0) {
  for (int64_t d : dims) {
    if (d < lo || d > std::numeric_limits<int>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": dimension ", d, " outside [", lo, ", 2^31)"));
    }
  }
  return absl::OkStatus();
}

// A GEMM op's shape: N rows (0 is a no-op) times inner / outer dimensions >= 1 (BLAS rejects a leading
// dimension of 0, which an empty inner dimension would give).
inline Status CheckGemmDims(const char* op, int64_t N, std::initializer_list<int64_t> dims) {
  ZERO_RETURN_IF_ERROR(CheckDims(op, {N}));
  return CheckDims(op, dims, 1);
}

inline Status CheckPointers(const char* op, std::initializer_list<const void*> ptrs) {
  int i = 0;
  for (const void* p : ptrs) {
    if (p == nullptr) return absl::InvalidArgumentError(absl::StrCat(op, ": pointer argument #", i, " is null"));
    ++i;
  }
  return absl::OkStatus();
}

// ---- matmul ---------------------------------------------------------------------------------------------

// y[N, OC] = x w (+ b): the bias is broadcast into y first and the GEMM adds the product (beta = 1), as ops.cc.
template <class Ex>
Status MatmulForward(Ex& ex, const float* x, const float* w, const float* b, int64_t N, int64_t IC, int64_t OC,
                     float* y) {
  ZERO_RETURN_IF_ERROR(CheckGemmDims("MatmulForward", N, {IC, OC}));
  if (N == 0) return absl::OkStatus();
  ZERO_RETURN_IF_ERROR(CheckPointers("MatmulForward", {x, w, y}));
  float beta = 0.0f;
  if (b != nullptr) {
    ZERO_RETURN_IF_ERROR(ex.Grid(body::BiasBroadcastOp{b, N, OC, y}));
    beta = 1.0f;
  }
  return ex.Gemm(body::RowMajorGemm(false, false, N, OC, IC, 1.0f, x, IC, w, OC, beta, y, OC));
}

// dx = dy w^T (written, when dx != nullptr); dw += x^T dy; db += column sums of dy (when db != nullptr).
template <class Ex>
Status MatmulBackward(Ex& ex, const float* dy, const float* x, const float* w, int64_t N, int64_t IC, int64_t OC,
                      float* dx, float* dw, float* db) {
  ZERO_RETURN_IF_ERROR(CheckGemmDims("MatmulBackward", N, {IC, OC}));
  if (N == 0) return absl::OkStatus();  // dx is empty, dw and db gain nothing
  ZERO_RETURN_IF_ERROR(CheckPointers("MatmulBackward", {dy, x, w, dw}));
  if (dx != nullptr) {
    ZERO_RETURN_IF_ERROR(ex.Gemm(body::RowMajorGemm(false, true, N, IC, OC, 1.0f, dy, OC, w, OC, 0.0f, dx, IC)));
  }
  ZERO_RETURN_IF_ERROR(ex.Gemm(body::RowMajorGemm(true, false, IC, OC, N, 1.0f, x, IC, dy, OC, 1.0f, dw, OC)));
  if (db != nullptr) ZERO_RETURN_IF_ERROR(ex.Grid(body::BiasGradOp{dy, N, OC, db}));
  return absl::OkStatus();
}

// logits[N, V] = x wte^T.
template <class Ex>
Status TiedHeadForward(Ex& ex, const float* x, const float* wte, int64_t N, int64_t C, int64_t V, float* logits) {
  ZERO_RETURN_IF_ERROR(CheckGemmDims("TiedHeadForward", N, {C, V}));
  if (N == 0) return absl::OkStatus();
  ZERO_RETURN_IF_ERROR(CheckPointers("TiedHeadForward", {x, wte, logits}));
  return ex.Gemm(body::RowMajorGemm(false, true, N, V, C, 1.0f, x, C, wte, C, 0.0f, logits, V));
}

// dx = dlogits wte (written); dwte += dlogits^T x.
template <class Ex>
Status TiedHeadBackward(Ex& ex, const float* dlogits, const float* x, const float* wte, int64_t N, int64_t C, int64_t V,
                        float* dx, float* dwte) {
  ZERO_RETURN_IF_ERROR(CheckGemmDims("TiedHeadBackward", N, {C, V}));
  if (N == 0) return absl::OkStatus();
  ZERO_RETURN_IF_ERROR(CheckPointers("TiedHeadBackward", {dlogits, x, wte, dx, dwte}));
  ZERO_RETURN_IF_ERROR(ex.Gemm(body::RowMajorGemm(false, false, N, C, V, 1.0f, dlogits, V, wte, C, 0.0f, dx, C)));
  return ex.Gemm(body::RowMajorGemm(true, false, V, C, N, 1.0f, dlogits, V, x, C, 1.0f, dwte, C));
}

// ---- layernorm ------------------------------------------------------------------------------------------

template <class Ex>
Status LayerNormForward(Ex& ex, const float* x, const float* w, const float* b, int64_t N, int64_t C, float* y,
                        float* mean, float* rstd) {
  ZERO_RETURN_IF_ERROR(CheckDims("LayerNormForward", {N, C}));
  if (N == 0) return absl::OkStatus();
  if (C == 0) return absl::InvalidArgumentError("LayerNormForward: C must be >= 1");
  ZERO_RETURN_IF_ERROR(CheckPointers("LayerNormForward", {x, w, b, y, mean, rstd}));
  ZERO_RETURN_IF_ERROR(ex.Grid(body::LayerNormStatsOp{x, N, C, mean, rstd}));
  return ex.Grid(body::LayerNormApplyOp{x, w, b, mean, rstd, N, C, y});
}

// dx += (accumulates), dw +=, db +=. dx must not alias dy or x.
template <class Ex>
Status LayerNormBackward(Ex& ex, const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                         int64_t N, int64_t C, float* dx, float* dw, float* db) {
  ZERO_RETURN_IF_ERROR(CheckDims("LayerNormBackward", {N, C}));
  if (N == 0 || C == 0) return absl::OkStatus();
  ZERO_RETURN_IF_ERROR(CheckPointers("LayerNormBackward", {dy, x, w, mean, rstd, dx, dw, db}));
  ZERO_RETURN_IF_ERROR(ex.Grid(body::LayerNormBackwardParamOp{dy, x, mean, rstd, N, C, dw, db}));
  return ex.Grid(body::LayerNormBackwardInputOp{dy, x, w, mean, rstd, N, C, dx});
}

// ---- GELU / residual --------------------------------------------------------------------------------------

template <class Ex>
Status GeluForward(Ex& ex, const float* x, int64_t n, float* y) {
  ZERO_RETURN_IF_ERROR(CheckDims("GeluForward", {n}));
  if (n == 0) return absl::OkStatus();
  ZERO_RETURN_IF_ERROR(CheckPointers("GeluForward", {x, y}));
  return ex.Grid(body::GeluForwardOp{x, n, y});
}

template <class Ex>
Status GeluBackward(Ex& ex, const float* dy, const float* x, int64_t n, float* dx) {
  ZERO_RETURN_IF_ERROR(CheckDims("GeluBackward", {n}));
  if (n == 0) return absl::OkStatus();
  ZERO_RETURN_IF_ERROR(CheckPointers("GeluBackward", {dy, x, dx}));
  return ex.Grid(body::GeluBackwardOp{dy, x, n, dx});
}

template <class Ex>
Status ResidualForward(Ex& ex, const float* a, const float* b, int64_t n, float* y) {
  ZERO_RETURN_IF_ERROR(CheckDims("ResidualForward", {n}));
  if (n == 0) return absl::OkStatus();
  ZERO_RETURN_IF_ERROR(CheckPointers("ResidualForward", {a, b, y}));
  return ex.Grid(body::ResidualOp{a, b, n, y});
}

// ---- causal self-attention -------------------------------------------------------------------------------
//
// Per (b, h) the CPU runs three GEMMs on views of qkv with row stride 3C. Here each GEMM runs for all b of one
// head h as one strided-batched call (the (b, h) offsets b*T*3C + h*hs are not one arithmetic progression over
// b*NH + h, but over b they are), so a phase is NH batched calls plus one softmax kernel over all B*NH*T rows.

inline Status CheckAttention(const char* op, int B, int T, int C, int NH) {
  ZERO_RETURN_IF_ERROR(CheckDims(op, {B, T, C, NH, 3LL * C, static_cast<int64_t>(NH) * T * T}));
  if (B < 1 || T < 1 || C < 1 || NH < 1 || C % NH != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": need B, T, C, NH >= 1 and NH | C, got B=", B, " T=", T, " C=", C, " NH=", NH));
  }
  return absl::OkStatus();
}

// Writes att[B, NH, T, T] (probabilities, zeros above the diagonal) and y[B, T, C].
template <class Ex>
Status AttentionForward(Ex& ex, const float* qkv, int B, int T, int C, int NH, float* att, float* y) {
  ZERO_RETURN_IF_ERROR(CheckAttention("AttentionForward", B, T, C, NH));
  ZERO_RETURN_IF_ERROR(CheckPointers("AttentionForward", {qkv, att, y}));
  const int64_t hs = C / NH;
  const int64_t C3 = 3LL * C;
  const int64_t TT = static_cast<int64_t>(T) * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int h = 0; h < NH; ++h) {
    const float* q = qkv + h * hs;
    const float* k = q + C;
    // Unscaled scores q k^T; the softmax applies the scale (before its max, like scaling inside the GEMM).
    ZERO_RETURN_IF_ERROR(ex.Gemm(body::RowMajorGemm(false, true, T, T, hs, 1.0f, q, C3, k, C3, 0.0f, att + h * TT, T, B,
                                                    T * C3, T * C3, NH * TT)));
  }
  ZERO_RETURN_IF_ERROR(ex.Grid(body::CausalSoftmaxOp{att, static_cast<int64_t>(B) * NH * T, T, scale}));
  for (int h = 0; h < NH; ++h) {
    const float* v = qkv + 2 * C + h * hs;
    ZERO_RETURN_IF_ERROR(ex.Gemm(body::RowMajorGemm(false, false, T, hs, T, 1.0f, att + h * TT, T, v, C3, 0.0f,
                                                    y + h * hs, C, B, NH * TT, T * C3, T * C)));
  }
  return absl::OkStatus();
}

// Writes every element of dqkv[B, T, 3C]. `scratch` must hold B*NH*T*T floats (all heads' score gradients at
// once; the CPU op reuses T*T).
template <class Ex>
Status AttentionBackward(Ex& ex, const float* dy, const float* qkv, const float* att, int B, int T, int C, int NH,
                         float* dqkv, float* scratch) {
  ZERO_RETURN_IF_ERROR(CheckAttention("AttentionBackward", B, T, C, NH));
  ZERO_RETURN_IF_ERROR(CheckPointers("AttentionBackward", {dy, qkv, att, dqkv, scratch}));
  const int64_t hs = C / NH;
  const int64_t C3 = 3LL * C;
  const int64_t TT = static_cast<int64_t>(T) * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int h = 0; h < NH; ++h) {
    const float* dout = dy + h * hs;
    const float* v = qkv + 2 * C + h * hs;
    float* dv = dqkv + 2 * C + h * hs;
    // y = a v  ->  da = dy v^T, dv = a^T dy.
    ZERO_RETURN_IF_ERROR(ex.Gemm(body::RowMajorGemm(false, true, T, T, hs, 1.0f, dout, C, v, C3, 0.0f, scratch + h * TT,
                                                    T, B, T * C, T * C3, NH * TT)));
    ZERO_RETURN_IF_ERROR(ex.Gemm(body::RowMajorGemm(true, false, T, hs, T, 1.0f, att + h * TT, T, dout, C, 0.0f, dv, C3,
                                                    B, NH * TT, T * C, T * C3)));
  }
  const int64_t rows = static_cast<int64_t>(B) * NH * T;
  ZERO_RETURN_IF_ERROR(ex.Grid(body::CausalSoftmaxBackwardOp{att, scratch, rows, T, scale}));
  for (int h = 0; h < NH; ++h) {
    const float* q = qkv + h * hs;
    const float* k = q + C;
    float* dq = dqkv + h * hs;
    float* dk = dq + C;
    // pre = scale q k^T  ->  dq = dpre k, dk = dpre^T q (scale already folded into dpre).
    ZERO_RETURN_IF_ERROR(ex.Gemm(body::RowMajorGemm(false, false, T, hs, T, 1.0f, scratch + h * TT, T, k, C3, 0.0f, dq,
                                                    C3, B, NH * TT, T * C3, T * C3)));
    ZERO_RETURN_IF_ERROR(ex.Gemm(body::RowMajorGemm(true, false, T, hs, T, 1.0f, scratch + h * TT, T, q, C3, 0.0f, dk,
                                                    C3, B, NH * TT, T * C3, T * C3)));
  }
  return absl::OkStatus();
}

// ---- softmax + cross-entropy -----------------------------------------------------------------------------

// probs = softmax(logits) per row (may alias); *loss = mean over rows of -log probs[target], via row_loss[N].
template <class Ex>
Status SoftmaxCrossEntropyForward(Ex& ex, const float* logits, const int32_t* targets, int64_t N, int64_t V,
                                  float* probs, float* loss, double* row_loss) {
  ZERO_RETURN_IF_ERROR(CheckDims("SoftmaxCrossEntropyForward", {N, V}));
  if (N < 1 || V < 1) return absl::InvalidArgumentError("SoftmaxCrossEntropyForward: need N, V >= 1");
  ZERO_RETURN_IF_ERROR(CheckPointers("SoftmaxCrossEntropyForward", {logits, targets, probs, loss, row_loss}));
  ZERO_RETURN_IF_ERROR(ex.Grid(body::CrossEntropyForwardOp{logits, targets, N, V, probs, row_loss}));
  return ex.Grid(body::CrossEntropyMeanOp{row_loss, N, loss});
}

template <class Ex>
Status SoftmaxCrossEntropyBackward(Ex& ex, const float* probs, const int32_t* targets, int64_t N, int64_t V,
                                   float* dlogits) {
  ZERO_RETURN_IF_ERROR(CheckDims("SoftmaxCrossEntropyBackward", {N, V}));
  if (N == 0 || V == 0) return absl::OkStatus();
  ZERO_RETURN_IF_ERROR(CheckPointers("SoftmaxCrossEntropyBackward", {probs, targets, dlogits}));
  return ex.Grid(body::CrossEntropyBackwardOp{probs, targets, N, V, dlogits});
}

}  // namespace zero::gpt::cuda::impl
