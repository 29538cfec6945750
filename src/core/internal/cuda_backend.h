// core/internal/cuda_backend.h — the seams between the CPU library (zero::zero) and the CUDA component (zero::cuda).
// defines: CudaBackend, RegisterCudaBackend, GetCudaBackend, CudaNotLinkedError.
//
// libzero.a references no CUDA or NCCL symbol, so a CPU-only trainer links it without libcudart or libnccl and
// configures it without the CUDA toolkit. Where the CPU library reaches the CUDA path (Communicator::CreateNccl,
// the CUDA engine's compute tier, pinned and device memory, the device count) it calls through this table of
// function pointers instead. libzero_cuda.a fills it before main: its registration object (src/shard/
// cuda_register.cc) is pulled into every program that links zero::cuda by the `--undefined` link option that
// target carries (docs/internals/design.md, "Layers"). Without zero::cuda the table is null and each seam fails with
// CudaNotLinkedError, except pinned host memory, which falls back to pageable memory as on a machine without a
// device (nothing in a program without zero::cuda moves memory to a device).
//
// This layer is the lowest: the types of the layers above are only declared here.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "zero/status.h"

struct CUstream_st;

namespace zero {
class Communicator;
class MemoryTracker;
class Store;
struct CommOptions;
}  // namespace zero

namespace zero::internal {

class ComputeTier;  // shard/internal/compute.h

// Every entry is set (zero::cuda registers one complete table). All are safe to call from any thread.
struct CudaBackend {
  // The CUDA devices this process sees; 0 without a driver or a device (the CUDA error is cleared).
  int (*device_count)();
  // Page-locked host memory of `bytes` (> 0), not zero-filled; nullptr on failure (the CUDA error is cleared).
  void* (*alloc_pinned)(size_t bytes);
  void (*free_pinned)(void* p);
  // Memory of the current device, zero-filled and synchronized before it returns (Buffer::Device's contract).
  // On failure nullptr and *error says which CUDA error (the CUDA error is cleared).
  void* (*alloc_device)(size_t bytes, Status* error);
  void (*free_device)(void* p);
  // Communicator::CreateNccl's implementation (comm/nccl_communicator.cc).
  StatusOr<std::unique_ptr<Communicator>> (*create_nccl)(std::shared_ptr<Store> store, int rank, int world_size,
                                                         const CommOptions& options);
  // MakeCudaCompute's implementation (shard/cuda_compute.cc).
  StatusOr<std::unique_ptr<ComputeTier>> (*make_compute)(MemoryTracker* tracker, int device, CUstream_st* stream);
};

// Installs `backend` (static storage; zero::cuda's registration calls it during static initialization).
void RegisterCudaBackend(const CudaBackend* backend);
// The registered table, or nullptr when zero::cuda is not linked into this program.
const CudaBackend* GetCudaBackend();

// kUnimplemented for `what` (the call that needs the CUDA path): "link zero::cuda" on an install that has the
// component, "built without CUDA" on one that has not.
Status CudaNotLinkedError(const std::string& what);

}  // namespace zero::internal
