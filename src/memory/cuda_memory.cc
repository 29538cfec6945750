// The CUDA runtime calls behind pinned and device Buffers (memory/internal/cuda_memory.h), in zero::cuda.
#include "memory/internal/cuda_memory.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"

namespace zero::internal {

int CudaDeviceCount() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not sticky, but leave nothing for the next caller to find
    return 0;
  }
  return devices;
}

void* CudaAllocPinned(size_t bytes) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return p;
}

void CudaFreePinned(void* p) { cudaFreeHost(p); }

void* CudaAllocDevice(size_t bytes, Status* error) {
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaSuccess) e = cudaMemset(p, 0, bytes);
  // cudaMemset runs on the legacy default stream, which a non-blocking stream does not wait for: finish it
  // before any stream may use the buffer. This synchronizes the device (Buffer::Device is never on a hot path).
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e == cudaSuccess) return p;
  if (p != nullptr) cudaFree(p);
  cudaGetLastError();
  *error = absl::ResourceExhaustedError(absl::StrCat("CUDA error ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
  return nullptr;
}

void CudaFreeDevice(void* p) { cudaFree(p); }

}  // namespace zero::internal
