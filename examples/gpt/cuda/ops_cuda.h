// examples/gpt/cuda/ops_cuda.h — the GPT's layer kernels (gpt/ops.h) on a CUDA device, fp32.
//
//   cublasHandle_t handle;  cublasCreate(&handle);  cublasSetStream(handle, stream);   // default math: no TF32
//   ZERO_RETURN_IF_ERROR(zero::gpt::cuda::MatmulForward(d_x, d_w, d_b, N, IC, OC, d_y, handle, stream));
//   ZERO_RETURN_IF_ERROR(zero::gpt::cuda::GeluForward(d_y, N * OC, d_y, stream));
//
// Each function has the meaning and argument order of its namesake in gpt/ops.h (same shapes, same
// aliasing rules, same write-vs-accumulate contract: activations and activation gradients are WRITTEN,
// parameter gradients ACCUMULATED), on device pointers, plus a cuBLAS handle where there are GEMMs and the
// stream last. Differences, all forced by the device:
// - SoftmaxCrossEntropyForward cannot return the loss: it writes it to the device scalar *d_loss, through a
//   caller-provided d_row_loss[N] (doubles) — rows are summed in order, not with atomics;
// - AttentionBackward's scratch holds B*NH*T*T floats (all heads at once), not T*T;
// - bad shapes and null pointers give kInvalidArgument instead of undefined behaviour; ids cannot be checked
//   without a host sync, so a target outside [0, V) gives a NaN loss (see ops_body.cuh).
//
// Stream order: every function enqueues its work on `stream` and returns; none synchronizes the host (none has
// Sync in its name). Results are valid once `stream` reaches the work. The cuBLAS handle must already be bound
// to `stream` (cublasSetStream), in host pointer mode, and in CUBLAS_DEFAULT_MATH or CUBLAS_PEDANTIC_MATH (no
// TF32): otherwise kFailedPrecondition and nothing of the failing GEMM is enqueued (earlier kernels of the same
// call may have been). Launch / cuBLAS failures give kInternal (kResourceExhausted for out-of-memory).
// Thread-compatible: calls on distinct handles / streams / buffers may run concurrently.
//
// Determinism and accuracy: no atomics anywhere — every reduction runs in a fixed order (one thread per row or
// column, as the CPU loops), and cuBLAS is deterministic for a fixed GPU model and library version — so results
// are bit-identical run after run on one machine. Against the CPU ops they differ by rounding only: GEMMs sum in
// another order (|error| <= 2 (K+2) 2^-24 sum|a||b| per element), and CUDA's expf / tanhf and FMA contraction
// move the element-wise ops by a few ulps. tests/gpt/cuda_check.h states the tolerances.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "zero/status.h"

namespace zero::gpt::cuda {

// ---- matmul ---------------------------------------------------------------------------------------------

// d_y[N, OC] = d_x[N, IC] d_w[IC, OC] (+ d_b[OC] when not null); N may be 0, IC and OC >= 1.
[[nodiscard]] Status MatmulForward(const float* d_x, const float* d_w, const float* d_b, int64_t N, int64_t IC,
                                   int64_t OC, float* d_y, cublasHandle_t handle, cudaStream_t stream);

// Writes d_dx = dy w^T (when d_dx != nullptr); accumulates d_dw += x^T dy and d_db += column sums of dy (when
// d_db != nullptr).
[[nodiscard]] Status MatmulBackward(const float* d_dy, const float* d_x, const float* d_w, int64_t N, int64_t IC,
                                    int64_t OC, float* d_dx, float* d_dw, float* d_db, cublasHandle_t handle,
                                    cudaStream_t stream);

// d_logits[N, V] = d_x[N, C] d_wte[V, C]^T.
[[nodiscard]] Status TiedHeadForward(const float* d_x, const float* d_wte, int64_t N, int64_t C, int64_t V,
                                     float* d_logits, cublasHandle_t handle, cudaStream_t stream);

// Writes d_dx = dlogits wte; accumulates d_dwte += dlogits^T x.
[[nodiscard]] Status TiedHeadBackward(const float* d_dlogits, const float* d_x, const float* d_wte, int64_t N,
                                      int64_t C, int64_t V, float* d_dx, float* d_dwte, cublasHandle_t handle,
                                      cudaStream_t stream);

// ---- layernorm ------------------------------------------------------------------------------------------

// y = (x - mean) * rstd * w + b per row; saves mean[N], rstd[N]. y may alias x.
[[nodiscard]] Status LayerNormForward(const float* d_x, const float* d_w, const float* d_b, int64_t N, int64_t C,
                                      float* d_y, float* d_mean, float* d_rstd, cudaStream_t stream);

// Accumulates d_dx += dL/dx, d_dw +=, d_db +=. d_dx must not alias d_dy or d_x.
[[nodiscard]] Status LayerNormBackward(const float* d_dy, const float* d_x, const float* d_w, const float* d_mean,
                                       const float* d_rstd, int64_t N, int64_t C, float* d_dx, float* d_dw, float* d_db,
                                       cudaStream_t stream);

// ---- GELU / residual --------------------------------------------------------------------------------------

// d_y = gelu(d_x) over n values (tanh approximation); d_y may alias d_x.
[[nodiscard]] Status GeluForward(const float* d_x, int64_t n, float* d_y, cudaStream_t stream);
// d_dx = d_dy * gelu'(d_x), d_x the forward input; d_dx may alias d_dy.
[[nodiscard]] Status GeluBackward(const float* d_dy, const float* d_x, int64_t n, float* d_dx, cudaStream_t stream);
// d_y = d_a + d_b; d_y may alias either.
[[nodiscard]] Status ResidualForward(const float* d_a, const float* d_b, int64_t n, float* d_y, cudaStream_t stream);

// ---- causal self-attention -------------------------------------------------------------------------------

// d_qkv [B, T, 3C] -> d_y [B, T, C]; saves the probabilities d_att [B, NH, T, T] (zeros above the diagonal).
[[nodiscard]] Status AttentionForward(const float* d_qkv, int B, int T, int C, int NH, float* d_att, float* d_y,
                                      cublasHandle_t handle, cudaStream_t stream);

// Writes every element of d_dqkv [B, T, 3C]. d_scratch: B*NH*T*T floats.
[[nodiscard]] Status AttentionBackward(const float* d_dy, const float* d_qkv, const float* d_att, int B, int T, int C,
                                       int NH, float* d_dqkv, float* d_scratch, cublasHandle_t handle,
                                       cudaStream_t stream);

// ---- softmax + cross-entropy -----------------------------------------------------------------------------

// d_probs = softmax(d_logits) per row (may alias); *d_loss = mean over the N >= 1 rows of -log probs[target],
// each row's term left in d_row_loss[N].
[[nodiscard]] Status SoftmaxCrossEntropyForward(const float* d_logits, const int32_t* d_targets, int64_t N, int64_t V,
                                                float* d_probs, float* d_loss, double* d_row_loss, cudaStream_t stream);

// d_dlogits = (probs - onehot(targets)) / N; may alias d_probs.
[[nodiscard]] Status SoftmaxCrossEntropyBackward(const float* d_probs, const int32_t* d_targets, int64_t N, int64_t V,
                                                 float* d_dlogits, cudaStream_t stream);

}  // namespace zero::gpt::cuda
