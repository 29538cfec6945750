// examples/gpt/cuda/device_exec.cuh — the device executor of ops_impl.h / model_impl.h: grid-stride kernels
// over the bodies of ops_body.cuh, cuBLAS for the GEMMs, async copies. nvcc only (included by the .cu files).
//
//   DeviceExec ex(handle, stream);      // handle's stream must be `stream` (checked at each GEMM)
//   ZERO_RETURN_IF_ERROR(impl::GeluForward(ex, d_x, n, d_y));
//
// Everything is enqueued on `stream`; nothing synchronizes the host. Errors are converted to Status in exactly
// two functions, CudaStatus and CublasStatus (ops_cuda.cu).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "gpt/cuda/ops_body.cuh"
#include "zero/status.h"

namespace zero::gpt::cuda::internal {

// cudaSuccess -> OK; cudaErrorMemoryAllocation -> kResourceExhausted; anything else -> kInternal, with `what`
// and the CUDA error's name and text.
Status CudaStatus(cudaError_t e, const char* what);
// CUBLAS_STATUS_SUCCESS -> OK; INVALID_VALUE -> kInvalidArgument; ALLOC_FAILED -> kResourceExhausted;
// NOT_INITIALIZED -> kFailedPrecondition; anything else -> kInternal.
Status CublasStatus(cublasStatus_t s, const char* what);

// Threads per block, and a cap on blocks: beyond it the grid-stride loop takes over.
inline constexpr int kThreads = 256;
inline constexpr int64_t kMaxBlocks = 1 << 16;

template <class Op>
__global__ void __launch_bounds__(kThreads) GridStrideKernel(const Op op) {
  body::GridStride(op, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x,
                   static_cast<int64_t>(gridDim.x) * blockDim.x);
}

class DeviceExec {
 public:
  // `handle` may be null for ops without GEMMs (Gemm then fails with kInvalidArgument).
  DeviceExec(cublasHandle_t handle, cudaStream_t stream) : handle_(handle), stream_(stream) {}

  template <class Op>
  Status Grid(const Op& op) {
    const int64_t n = op.size();
    if (n <= 0) return absl::OkStatus();
    const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks);
    GridStrideKernel<Op><<<static_cast<unsigned>(blocks), kThreads, 0, stream_>>>(op);
    return CudaStatus(cudaGetLastError(), "kernel launch");
  }

  // One cublasSgemm / cublasSgemmStridedBatched. Refuses (kFailedPrecondition) a handle that is not on this
  // executor's stream, is in device pointer mode, or would use TF32 (so results stay comparable to the CPU).
  Status Gemm(const body::GemmCall& g);

  Status Copy(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return absl::OkStatus();
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync");
  }

  Status Zero(void* dst, size_t bytes) {
    if (bytes == 0) return absl::OkStatus();
    return CudaStatus(cudaMemsetAsync(dst, 0, bytes, stream_), "cudaMemsetAsync");
  }

  cudaStream_t stream() const { return stream_; }

 private:
  cublasHandle_t handle_;
  cudaStream_t stream_;
};

}  // namespace zero::gpt::cuda::internal
