// Blockwise int8 quantization and dequantization on the device (ZeRO++'s qwZ wire format), bit for bit the host
// reference QuantizeInt8Scalar / DequantizeInt8Scalar (core/internal/quantize.h). The per-thread bodies and the
// reasons the bits agree are in cuda/internal/quantize.cuh (16-byte vector bodies, quantize's input read once
// through registers); this file adds the CUDA block's max reduction and the launches (threads per CUDA block and
// vectors cached per thread: launch.h's QuantShape, production QuantShapeOf(dt)). One launch each, on the
// caller's stream, no atomics, no workspace.
#include <cuda_runtime.h>

#include "cuda/internal/launch.h"
#include "cuda/internal/quantize.cuh"

namespace zero::cuda::internal {

namespace {

constexpr int kWarps = kThreads / 32;

// The maximum of every thread's `m` in the CUDA block, returned to every thread. blockDim.x is a multiple of 32
// (QuantThreads), so every warp is full for the shuffles. The max of integers is exact and order-free: any tree
// gives the same value. `warp_max` is reused by the next call only after a __syncthreads (the callers').
__device__ __forceinline__ uint32_t BlockMax(uint32_t m, uint32_t* warp_max) {
  for (int off = 16; off > 0; off >>= 1) {
    const uint32_t o = __shfl_xor_sync(0xFFFFFFFFu, m, off);
    m = o > m ? o : m;
  }
  const int warp = static_cast<int>(threadIdx.x) / 32;
  if ((threadIdx.x & 31u) == 0) warp_max[warp] = m;
  __syncthreads();
  const int warps = static_cast<int>(blockDim.x) / 32;
  uint32_t r = 0;
  for (int w = 0; w < warps; ++w) r = warp_max[w] > r ? warp_max[w] : r;
  return r;
}

// `phase`: QuantVecPhase(x, sizeof(T::Elem), q), the same for every block. C: vectors cached per thread.
template <class T, int C>
__global__ void __launch_bounds__(kThreads)
    QuantizeKernel(const void* x, size_t n, size_t block, size_t phase, int8_t* q, float* scales) {
  __shared__ uint32_t warp_max[kWarps];
  const size_t nblocks = QuantBlockCount(n, block);
  const size_t tid = threadIdx.x;
  const size_t nthreads = blockDim.x;
  for (size_t b = blockIdx.x; b < nblocks; b += gridDim.x) {
    const size_t begin = b * block;
    const size_t end = begin + block < n ? begin + block : n;
    const QuantSpan span = QuantSpanOf<T>(begin, end, phase);
    QuantRegs<T, C>
        regs;  // this thread's first vectors, read once: the max pass loads them, the coding pass codes them
    const uint32_t m = BlockMax(QuantMaxPass<T>(x, begin, end, span, regs, tid, nthreads), warp_max);
    // Every thread derives the scale itself (two divisions) rather than waiting for a broadcast.
    const QuantScale s = QuantScaleOfBits(QuantMaxAsF32Bits<T>(m));
    if (tid == 0) scales[b] = s.scale;
    QuantCodePass<T>(x, begin, end, span, regs, s.inv, q, tid, nthreads);
    __syncthreads();  // every thread has read warp_max before the next block's BlockMax writes it
  }
}

// `phase`: QuantVecPhase(out, sizeof(D::Elem), q).
template <class D, int C>
__global__ void __launch_bounds__(kThreads)
    DequantizeKernel(const int8_t* q, const float* scales, size_t n, size_t block, size_t phase, void* out) {
  const size_t nblocks = QuantBlockCount(n, block);
  for (size_t b = blockIdx.x; b < nblocks; b += gridDim.x) {
    const size_t begin = b * block;
    const size_t end = begin + block < n ? begin + block : n;
    DequantizeSpanThread<D, C>(q, scales[b], begin, end, QuantSpanOf<D>(begin, end, phase), out, threadIdx.x,
                               blockDim.x);
  }
}

template <class T>
cudaError_t LaunchQuantTyped(const void* x, size_t n, size_t block, QuantShape shape, int8_t* q, float* scales,
                             cudaStream_t stream) {
  const size_t phase = QuantVecPhase(x, sizeof(typename T::Elem), q);
  const unsigned grid = QuantGridBlocks(n, block), threads = QuantThreads(block, shape.max_threads);
  if (shape.cached == 8) {
    QuantizeKernel<T, 8><<<grid, threads, 0, stream>>>(x, n, block, phase, q, scales);
  } else {
    QuantizeKernel<T, 4><<<grid, threads, 0, stream>>>(x, n, block, phase, q, scales);
  }
  return cudaGetLastError();
}

template <class D>
cudaError_t LaunchDequantTyped(const int8_t* q, const float* scales, size_t n, size_t block, QuantShape shape,
                               void* out, cudaStream_t stream) {
  const size_t phase = QuantVecPhase(out, sizeof(typename D::Elem), q);
  const unsigned grid = QuantGridBlocks(n, block), threads = QuantThreads(block, shape.max_threads);
  if (shape.cached == 8) {
    DequantizeKernel<D, 8><<<grid, threads, 0, stream>>>(q, scales, n, block, phase, out);
  } else {
    DequantizeKernel<D, 4><<<grid, threads, 0, stream>>>(q, scales, n, block, phase, out);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchQuantizeInt8Shaped(const void* d_x, Dt dt, size_t n, size_t block, QuantShape shape, int8_t* d_q,
                                     float* d_scales, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (block == 0 || !QuantShapeValid(shape)) return cudaErrorInvalidValue;
  switch (dt) {
    case Dt::kF32: return LaunchQuantTyped<F32>(d_x, n, block, shape, d_q, d_scales, stream);
    case Dt::kF16: return LaunchQuantTyped<F16>(d_x, n, block, shape, d_q, d_scales, stream);
    case Dt::kBF16: return LaunchQuantTyped<BF16>(d_x, n, block, shape, d_q, d_scales, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchDequantizeInt8Shaped(const int8_t* d_q, const float* d_scales, size_t n, size_t block,
                                       QuantShape shape, void* d_out, Dt dt, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (block == 0 || !QuantShapeValid(shape)) return cudaErrorInvalidValue;
  switch (dt) {
    case Dt::kF32: return LaunchDequantTyped<F32>(d_q, d_scales, n, block, shape, d_out, stream);
    case Dt::kF16: return LaunchDequantTyped<F16>(d_q, d_scales, n, block, shape, d_out, stream);
    case Dt::kBF16: return LaunchDequantTyped<BF16>(d_q, d_scales, n, block, shape, d_out, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchQuantizeInt8(const void* d_x, Dt dt, size_t n, size_t block, int8_t* d_q, float* d_scales,
                               cudaStream_t stream) {
  return LaunchQuantizeInt8Shaped(d_x, dt, n, block, QuantShapeOf(dt), d_q, d_scales, stream);
}

cudaError_t LaunchDequantizeInt8(const int8_t* d_q, const float* d_scales, size_t n, size_t block, void* d_out, Dt dt,
                                 cudaStream_t stream) {
  return LaunchDequantizeInt8Shaped(d_q, d_scales, n, block, QuantShapeOf(dt), d_out, dt, stream);
}

}  // namespace zero::cuda::internal
