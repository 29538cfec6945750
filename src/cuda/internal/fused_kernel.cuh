// The fused optimizer step's kernels and their launch, as templates over the variant (fused_optim.cuh): the
// production launcher in src/cuda/optim.cu instantiates FusedProductionVariant; zero-bench-gpu and the GPU
// tests instantiate the others, so every variant is timed and checked without being compiled into `zero`.
//
// Device code: include only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include "cuda/internal/fused_optim.cuh"
#include "cuda/internal/launch.h"

namespace zero::cuda::internal {

// How many blocks a tiled launch gets.
enum class FusedGrid : uint8_t {
  // Resident blocks per SM (occupancy API) x SM count, capped by the work: each block loops over tiles.
  kFullWave = 0,
  // One tile per block (no loop), however many blocks that takes.
  kOnePass = 1,
};

// The first version's kernel: one full wave of kThreads-thread blocks grid-striding over 8-element vectors.
template <class G, class P, class Op>
__global__ void __launch_bounds__(kThreads) FusedStepV1Kernel(FusedArgs a, Op op) {
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t nthreads = static_cast<size_t>(gridDim.x) * blockDim.x;
  FusedStepThread<G, P, Op>(a, op, tid, nthreads);
}

// The tiled kernel. The block size is the constant kThreads (the launch uses exactly that), so the tile and
// unit strides are compile-time constants.
template <class G, class P, class Op, class V>
__global__ void __launch_bounds__(kThreads) FusedStepTiledKernel(FusedArgs a, Op op) {
  FusedStepTiledThread<G, P, Op, V>(a, op, blockIdx.x, gridDim.x, threadIdx.x, kThreads);
}

template <class G, class P, class Op>
cudaError_t LaunchFusedV1(const FusedArgs& a, const Op& op, cudaStream_t stream) {
  const size_t work = a.plan.nvec > a.plan.ScalarCount() ? a.plan.nvec : a.plan.ScalarCount();
  if (work == 0) return cudaSuccess;
  size_t blocks = (work + kThreads - 1) / kThreads;
  int wave = 0;
  if (cudaError_t e = FullWaveBlocks(reinterpret_cast<const void*>(&FusedStepV1Kernel<G, P, Op>), kThreads, &wave);
      e != cudaSuccess) {
    return e;
  }
  if (blocks > static_cast<size_t>(wave)) blocks = static_cast<size_t>(wave);
  FusedStepV1Kernel<G, P, Op><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a, op);
  return cudaGetLastError();
}

// One step over a.plan.n elements with variant V on `grid` blocks (a.plan from MakeFusedPlan).
template <class G, class P, class Op, class V>
cudaError_t LaunchFusedTiled(const FusedArgs& a, const Op& op, FusedGrid grid, cudaStream_t stream) {
  const size_t units = a.plan.nvec * (8 / V::kUnitElems);
  const size_t tile = static_cast<size_t>(kThreads) * V::kUnits;
  // Blocks with something to do: one per tile (the leftover units and the scalars fit in those, or in one
  // block when there is no whole tile).
  size_t blocks = (units + tile - 1) / tile;
  const size_t scalar_blocks = (a.plan.ScalarCount() + kThreads - 1) / kThreads;
  if (scalar_blocks > blocks) blocks = scalar_blocks;
  if (blocks == 0) return cudaSuccess;
  if (grid == FusedGrid::kFullWave) {
    int wave = 0;
    if (cudaError_t e =
            FullWaveBlocks(reinterpret_cast<const void*>(&FusedStepTiledKernel<G, P, Op, V>), kThreads, &wave);
        e != cudaSuccess) {
      return e;
    }
    if (blocks > static_cast<size_t>(wave)) blocks = static_cast<size_t>(wave);
  }
  if (blocks > 0x7FFFFFFFu) return cudaErrorInvalidValue;  // beyond gridDim.x (n > 2^41 elements)
  FusedStepTiledKernel<G, P, Op, V><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a, op);
  return cudaGetLastError();
}

}  // namespace zero::cuda::internal
