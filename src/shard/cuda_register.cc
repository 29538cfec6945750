// zero::cuda's registration: fills the CPU library's table of CUDA seams (core/internal/cuda_backend.h) with
// the implementations in libzero_cuda.a, during static initialization.
//
// A static archive's member is linked only when something references it, and nothing in a trainer references
// this file: the zero::cuda target therefore carries the link option `--undefined=zero_cuda_register` (src/
// CMakeLists.txt), installed with it, so that a plain target_link_libraries(app zero::cuda) pulls this member
// in and its initializer runs. It references the rest (the NCCL communicator, the CUDA tier, the memory calls),
// which pulls those members in too.
#include "comm/internal/nccl.h"
#include "core/internal/cuda_backend.h"
#include "memory/internal/cuda_memory.h"
#include "shard/internal/compute.h"

namespace zero::internal {
namespace {

constexpr CudaBackend kCudaBackend{
    .device_count = CudaDeviceCount,
    .alloc_pinned = CudaAllocPinned,
    .free_pinned = CudaFreePinned,
    .alloc_device = CudaAllocDevice,
    .free_device = CudaFreeDevice,
    .create_nccl = CreateNcclCommunicator,
    .make_compute = MakeCudaComputeTier,
};

}  // namespace
}  // namespace zero::internal

// The symbol the link option names (C linkage: one spelling for every compiler). Its initializer registers the
// table, so a program that links zero::cuda has it before main.
extern "C" const bool zero_cuda_register = (zero::internal::RegisterCudaBackend(&zero::internal::kCudaBackend), true);
