// examples/gpt/ops.h — the CPU kernels of the reference GPT: forward and backward of each layer type.
//
//   // y[N, OC] = x[N, IC] W[IC, OC] + b          (weights are stored [in, out], row-major)
//   zero::gpt::ops::MatmulForward(x, w, b, N, IC, OC, y);
//   zero::gpt::ops::MatmulBackward(dy, x, w, N, IC, OC, dx, dw, db);   // dx written, dw/db accumulated
//
// These are the building blocks that model.cc composes into embedding / block / head phases. They are a
// separate header so that tests can check every backward against a double-precision reference on tiny sizes
// (llm.c keeps the same split between its layer functions and the model that strings them together).
//
// Conventions shared by every function here:
// - activations are row-major [N, C] with N = B*T rows (one row per token);
// - forward functions write (=) their outputs;
// - backward functions WRITE the gradient of their input activation (unless the comment says "accumulates")
//   and ACCUMULATE (+=) into parameter gradients, so a tied weight can receive several contributions and a
//   sharding engine can zero its gradient buffers once per step;
// - all loops run in a fixed order and matrix products go through cblas_sgemm, so results are bit-identical
//   run after run for a fixed number of BLAS threads (they are not guaranteed identical across thread
//   counts or CPUs, since OpenBLAS picks kernels by CPU).
#pragma once

#include <cstdint>

namespace zero::gpt::ops {

// Epsilon of every layernorm (GPT-2's value).
inline constexpr float kLayerNormEps = 1e-5f;

// ---- matmul ---------------------------------------------------------------------------------------------

// y[N, OC] = x[N, IC] w[IC, OC] (+ b[OC] when b != nullptr). y must not alias x or w.
void MatmulForward(const float* x, const float* w, const float* b, int64_t N, int64_t IC, int64_t OC, float* y);

// Given dy = dL/dy: writes dx[N, IC] = dy w^T when dx != nullptr, accumulates dw[IC, OC] += x^T dy and
// db[OC] += column sums of dy (db may be nullptr when there is no bias).
void MatmulBackward(const float* dy, const float* x, const float* w, int64_t N, int64_t IC, int64_t OC, float* dx,
                    float* dw, float* db);

// logits[N, V] = x[N, C] wte[V, C]^T: the LM head tied to the token embedding table.
void TiedHeadForward(const float* x, const float* wte, int64_t N, int64_t C, int64_t V, float* logits);

// Writes dx[N, C] = dlogits wte and accumulates dwte[V, C] += dlogits^T x.
void TiedHeadBackward(const float* dlogits, const float* x, const float* wte, int64_t N, int64_t C, int64_t V,
                      float* dx, float* dwte);

// ---- layernorm ------------------------------------------------------------------------------------------

// y = (x - mean) * rstd * w + b per row of x[N, C], with the biased variance. Saves mean[N] and rstd[N]
// for the backward pass. y may alias x.
void LayerNormForward(const float* x, const float* w, const float* b, int64_t N, int64_t C, float* y, float* mean,
                      float* rstd);

// Accumulates dx[N, C] += dL/dx (accumulates: callers fold the residual branch in this way), dw += and
// db += from dy, the forward input x and its saved mean / rstd.
void LayerNormBackward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd, int64_t N,
                       int64_t C, float* dx, float* dw, float* db);

// ---- GELU (GPT-2's tanh approximation) -------------------------------------------------------------------

// y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise over n values. y may alias x.
void GeluForward(const float* x, int64_t n, float* y);

// dx = dy * gelu'(x), elementwise; x is the forward INPUT. dx may alias dy.
void GeluBackward(const float* dy, const float* x, int64_t n, float* dx);

// ---- causal self-attention -------------------------------------------------------------------------------

// qkv is [B, T, 3C] holding q | k | v per token (each C = NH heads of hs = C / NH, head-major inside C).
// Writes y[B, T, C] (heads concatenated) and saves the softmax probabilities att[B, NH, T, T] (zeros above
// the diagonal) for the backward pass. Scores are scaled by 1/sqrt(hs).
void AttentionForward(const float* qkv, int B, int T, int C, int NH, float* att, float* y);

// Writes dqkv[B, T, 3C] (every element) from dy[B, T, C], the forward qkv and the saved att.
// `scratch` must hold T*T floats.
void AttentionBackward(const float* dy, const float* qkv, const float* att, int B, int T, int C, int NH, float* dqkv,
                       float* scratch);

// ---- residual --------------------------------------------------------------------------------------------

// y = a + b elementwise; y may alias a or b.
void ResidualForward(const float* a, const float* b, int64_t n, float* y);

// ---- softmax + cross-entropy -----------------------------------------------------------------------------

// probs[N, V] = softmax(logits) per row (probs may alias logits). Returns the MEAN over the N rows of
// -log probs[row, targets[row]]. Targets must lie in [0, V).
float SoftmaxCrossEntropyForward(const float* logits, const int32_t* targets, int64_t N, int64_t V, float* probs);

// Writes dlogits = (probs - onehot(targets)) / N, the gradient of the mean loss; dlogits may alias probs.
void SoftmaxCrossEntropyBackward(const float* probs, const int32_t* targets, int64_t N, int64_t V, float* dlogits);

}  // namespace zero::gpt::ops
