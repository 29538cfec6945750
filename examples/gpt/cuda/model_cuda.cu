// The GPT's phases on the device: model_impl.h's compositions run by the device executor.
#include <utility>

#include "gpt/cuda/device_exec.cuh"
#include "gpt/cuda/model_cuda.h"
#include "gpt/cuda/model_impl.h"

namespace zero::gpt::cuda {

using internal::CudaStatus;
using internal::DeviceExec;

// ---- DeviceActivations -----------------------------------------------------------------------------------

StatusOr<DeviceActivations> DeviceActivations::Create(const GptConfig& cfg, int B, int T) {
  ZERO_RETURN_IF_ERROR(impl::CheckShape(cfg, B, T));
  DeviceActivations a;
  a.bytes_ = ActivationViews::Bytes(cfg, B, T);
  ZERO_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&a.memory_, a.bytes_), "DeviceActivations: cudaMalloc"));
  a.Bind(cfg, B, T, a.memory_);
  return a;
}

DeviceActivations::DeviceActivations(DeviceActivations&& other) noexcept
    : ActivationViews(std::move(other)),
      memory_(std::exchange(other.memory_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

DeviceActivations& DeviceActivations::operator=(DeviceActivations&& other) noexcept {
  if (this != &other) {
    if (memory_ != nullptr) cudaFree(memory_);
    ActivationViews::operator=(std::move(other));
    memory_ = std::exchange(other.memory_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceActivations::~DeviceActivations() {
  // cudaFree waits for the device; an error here (e.g. a sticky error of an earlier kernel) has no caller to
  // report to, and leaking is the only alternative, so it is ignored.
  if (memory_ != nullptr) cudaFree(memory_);
}

// ---- phases ----------------------------------------------------------------------------------------------

Status EmbeddingForward(const GptConfig& cfg, const RootWeights& w, const int32_t* d_tokens, int B, int T,
                        float* d_x_out, cudaStream_t stream) {
  DeviceExec ex(nullptr, stream);
  return impl::EmbeddingForward(ex, cfg, w, d_tokens, B, T, d_x_out);
}

Status BlockForward(const GptConfig& cfg, const BlockWeights& w, const float* d_x_in, float* d_x_out, BlockActs* acts,
                    cublasHandle_t handle, cudaStream_t stream) {
  DeviceExec ex(handle, stream);
  return impl::BlockForward(ex, cfg, w, d_x_in, d_x_out, acts);
}

Status HeadForward(const GptConfig& cfg, const RootWeights& w, const float* d_x, const int32_t* d_targets,
                   DeviceHeadActs* acts, cublasHandle_t handle, cudaStream_t stream) {
  DeviceExec ex(handle, stream);
  return impl::HeadForward(ex, cfg, w, d_x, d_targets, acts);
}

StatusOr<float> HeadForwardSync(const GptConfig& cfg, const RootWeights& w, const float* d_x, const int32_t* d_targets,
                                DeviceHeadActs* acts, cublasHandle_t handle, cudaStream_t stream) {
  ZERO_RETURN_IF_ERROR(HeadForward(cfg, w, d_x, d_targets, acts, handle, stream));
  float loss = 0.0f;
  ZERO_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(&loss, acts->loss, sizeof(float), cudaMemcpyDeviceToHost, stream),
                                  "HeadForwardSync: copy loss"));
  ZERO_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "HeadForwardSync: cudaStreamSynchronize"));
  return loss;
}

Status HeadBackward(const GptConfig& cfg, const RootWeights& w, const RootGrads& g, DeviceHeadActs* acts, float* d_dx,
                    cublasHandle_t handle, cudaStream_t stream) {
  DeviceExec ex(handle, stream);
  return impl::HeadBackward(ex, cfg, w, g, acts, d_dx);
}

Status BlockBackward(const GptConfig& cfg, const BlockWeights& w, const BlockGrads& g, const BlockActs& acts,
                     const float* d_dx_out, float* d_dx_in, DeviceBlockScratch* scratch, cublasHandle_t handle,
                     cudaStream_t stream) {
  DeviceExec ex(handle, stream);
  return impl::BlockBackward(ex, cfg, w, g, acts, d_dx_out, d_dx_in, scratch);
}

Status EmbeddingBackward(const GptConfig& cfg, const RootGrads& g, const int32_t* d_tokens, int B, int T,
                         const float* d_dx, cudaStream_t stream) {
  DeviceExec ex(nullptr, stream);
  return impl::EmbeddingBackward(ex, cfg, g, d_tokens, B, T, d_dx);
}

}  // namespace zero::gpt::cuda
