// memory/internal/cuda_memory.h — the CUDA runtime calls behind Buffer::Pinned, Buffer::Device and their frees.
// defines: CudaDeviceCount, CudaAllocPinned, CudaFreePinned, CudaAllocDevice, CudaFreeDevice.
//
// Part of zero::cuda (libzero_cuda.a), not of the CPU library: tracker.cc reaches them only through the table
// of core/internal/cuda_backend.h, which zero::cuda's registration fills with them. Contracts: CudaBackend.
#pragma once

#include <cstddef>

#include "zero/status.h"

namespace zero::internal {

int CudaDeviceCount();
void* CudaAllocPinned(size_t bytes);
void CudaFreePinned(void* p);
void* CudaAllocDevice(size_t bytes, Status* error);
void CudaFreeDevice(void* p);

}  // namespace zero::internal
