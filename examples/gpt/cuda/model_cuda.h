// examples/gpt/cuda/model_cuda.h — the GPT's phases (gpt/model.h) on a CUDA device, fp32, stream-ordered.
//
//   ZERO_ASSIGN_OR_RETURN(auto acts, zero::gpt::cuda::DeviceActivations::Create(cfg, B, T));
//   namespace gc = zero::gpt::cuda;
//   const RootWeights rw = RootWeightsFromFlat(cfg, d_root_params);          // views of DEVICE memory
//   ZERO_RETURN_IF_ERROR(gc::EmbeddingForward(cfg, rw, d_tokens, B, T, acts.x, stream));
//   for (l = 0..L-1) ZERO_RETURN_IF_ERROR(gc::BlockForward(cfg, bw[l], acts.x, acts.x, &acts.blocks[l], h, stream));
//   ZERO_ASSIGN_OR_RETURN(float loss, gc::HeadForwardSync(cfg, rw, acts.x, d_targets, &acts.head, h, stream));
//   ZERO_RETURN_IF_ERROR(gc::HeadBackward(cfg, rw, rg, &acts.head, acts.dx, h, stream));
//   for (l = L-1..0) ZERO_RETURN_IF_ERROR(gc::BlockBackward(cfg, bw[l], bg[l], acts.blocks[l], acts.dx, acts.dx,
//                                                           &acts.scratch, h, stream));
//   ZERO_RETURN_IF_ERROR(gc::EmbeddingBackward(cfg, rg, d_tokens, B, T, acts.dx, stream));
//
// Same contracts as the CPU phases: the weight / gradient views are model.h's RootWeights / BlockWeights /
// RootGrads / BlockGrads (raw float pointers, here to device memory: the *FromFlat helpers only do pointer
// arithmetic, so they work on a device buffer); gradients ACCUMULATE, activation gradients are WRITTEN; loss and
// gradients are of the mean cross-entropy over the B*T tokens. tokens / targets are device int32 arrays [B, T].
// Block activations are model.h's BlockActs bound to device memory; the scratch and head buffers are the
// device variants of model_impl.h (attention scratch for all heads, the loss kept on the device).
//
// Stream order: everything is enqueued on `stream`, no host synchronization, except in HeadForwardSync (and
// DeviceActivations::Create, which allocates). The cuBLAS handle must be bound to `stream` (see ops_cuda.h).
// Bad shapes return kInvalidArgument; ids outside [0, vocab) cannot be checked without a sync: a bad token gives
// NaN activations, a bad target a NaN loss (the CPU aborts instead). Deterministic: bit-identical run after run
// on one GPU (no atomics; see ops_cuda.h).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpt/cuda/model_impl.h"  // defines: ActivationViews, DeviceBlockScratch, DeviceHeadActs
#include "gpt/model.h"
#include "zero/status.h"

namespace zero::gpt::cuda {

// Every activation buffer of the model for one (B, T) in ONE cudaMalloc, carved into the views of
// ActivationViews (blocks[l], scratch, head, x, dx); freed on destruction. Move-only. Allocate once per shape
// and reuse: cudaMalloc / cudaFree synchronize the device.
class DeviceActivations : public ActivationViews {
 public:
  // kInvalidArgument for a bad config or shape; kResourceExhausted when the allocation fails.
  static StatusOr<DeviceActivations> Create(const GptConfig& cfg, int B, int T);

  DeviceActivations() = default;
  DeviceActivations(DeviceActivations&& other) noexcept;
  DeviceActivations& operator=(DeviceActivations&& other) noexcept;
  DeviceActivations(const DeviceActivations&) = delete;
  DeviceActivations& operator=(const DeviceActivations&) = delete;
  ~DeviceActivations();

  // The one device allocation all views point into, and its size.
  void* data() const { return memory_; }
  size_t bytes() const { return bytes_; }

 private:
  void* memory_ = nullptr;
  size_t bytes_ = 0;
};

// x_out[b*T + t, :] = wte[tokens[b*T + t], :] + wpe[t, :].
[[nodiscard]] Status EmbeddingForward(const GptConfig& cfg, const RootWeights& w, const int32_t* d_tokens, int B, int T,
                                      float* d_x_out, cudaStream_t stream);

// One pre-layernorm block; B and T are acts->B / acts->T. d_x_out may alias d_x_in.
[[nodiscard]] Status BlockForward(const GptConfig& cfg, const BlockWeights& w, const float* d_x_in, float* d_x_out,
                                  BlockActs* acts, cublasHandle_t handle, cudaStream_t stream);

// Final layernorm, tied head, softmax cross-entropy; the mean loss is written to the device scalar acts->loss.
[[nodiscard]] Status HeadForward(const GptConfig& cfg, const RootWeights& w, const float* d_x, const int32_t* d_targets,
                                 DeviceHeadActs* acts, cublasHandle_t handle, cudaStream_t stream);

// HeadForward, then copies the loss to the host and BLOCKS until `stream` has finished everything enqueued so far.
[[nodiscard]] StatusOr<float> HeadForwardSync(const GptConfig& cfg, const RootWeights& w, const float* d_x,
                                              const int32_t* d_targets, DeviceHeadActs* acts, cublasHandle_t handle,
                                              cudaStream_t stream);

// Accumulates g.wte (LM-head half), g.lnf_w, g.lnf_b; writes d_dx. Consumes acts->probs (one backward per forward).
[[nodiscard]] Status HeadBackward(const GptConfig& cfg, const RootWeights& w, const RootGrads& g, DeviceHeadActs* acts,
                                  float* d_dx, cublasHandle_t handle, cudaStream_t stream);

// Accumulates into every field of g; writes d_dx_in from d_dx_out (may alias).
[[nodiscard]] Status BlockBackward(const GptConfig& cfg, const BlockWeights& w, const BlockGrads& g,
                                   const BlockActs& acts, const float* d_dx_out, float* d_dx_in,
                                   DeviceBlockScratch* scratch, cublasHandle_t handle, cudaStream_t stream);

// g.wte[tokens[i]] += dx[i], g.wpe[t] += dx[b*T + t], in row order (deterministic, no atomics).
[[nodiscard]] Status EmbeddingBackward(const GptConfig& cfg, const RootGrads& g, const int32_t* d_tokens, int B, int T,
                                       const float* d_dx, cudaStream_t stream);

}  // namespace zero::gpt::cuda
