// BatchCopy: many device-to-device segments in one launch (flatten / unflatten of a unit's tensors).
#include <cuda_runtime.h>

#include "cuda/internal/launch.h"

namespace zero::cuda::internal {

namespace {

// __grid_constant__: the 8 KiB table stays in the kernel-parameter bank even though the body indexes it with
// run-time indices (otherwise the compiler may copy it to each thread's local memory).
__global__ void __launch_bounds__(kThreads) BatchCopyKernel(const __grid_constant__ BatchCopyTable table) {
  BatchCopyThread(table, blockIdx.x, gridDim.x, threadIdx.x, blockDim.x);
}

}  // namespace

cudaError_t LaunchBatchCopy(const CopySeg* segs, int count, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  if (count > kCopySegmentsPerLaunch) return cudaErrorInvalidValue;
  BatchCopyTable table;
  table.count = count;
  table.tile_begin[0] = 0;
  for (int i = 0; i < count; ++i) {
    table.src[i] = static_cast<const unsigned char*>(segs[i].src);
    table.dst[i] = static_cast<unsigned char*>(segs[i].dst);
    table.bytes[i] = segs[i].bytes;
    table.tile_begin[i + 1] = table.tile_begin[i] + (segs[i].bytes + kCopyTileBytes - 1) / kCopyTileBytes;
  }
  const size_t tiles = table.tile_begin[count];
  if (tiles == 0) return cudaSuccess;
  int wave = 0;
  if (cudaError_t e = FullWaveBlocks(reinterpret_cast<const void*>(&BatchCopyKernel), kThreads, &wave);
      e != cudaSuccess) {
    return e;
  }
  const size_t blocks = tiles < static_cast<size_t>(wave) ? tiles : static_cast<size_t>(wave);
  BatchCopyKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(table);
  return cudaGetLastError();
}

}  // namespace zero::cuda::internal
