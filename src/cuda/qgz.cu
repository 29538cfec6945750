// ZeRO++ qgZ's element kernels on the device: int4 quantize and dequantize, LoCo's residual step and the average's
// division, bit for bit the host tier's scalar references (core/internal/quantize.h's QuantizeInt4 / DequantizeInt4,
// shard/internal/compute.h's LocoResidualOnHost / DivideOnHost). The per-thread bodies and why the bits agree are in
// cuda/internal/qgz.cuh; this file adds the int4 scale pass's block max reduction and the launches, all on the
// caller's stream, no atomics.
#include <cuda_runtime.h>

#include "cuda/internal/launch.h"
#include "cuda/internal/qgz.cuh"

namespace zero::cuda::internal {

namespace {

constexpr int kWarps = kThreads / 32;

// Each quantization block's maximum |x| bits (every thread's partial, reduced through shared memory: an integer
// max, so the tree does not change the value), then its scale and factor, written by thread 0.
__global__ void __launch_bounds__(kThreads)
    Int4ScalesKernel(const float* x, size_t n, size_t block, float* scales, float* inv) {
  __shared__ uint32_t warp_max[kWarps];
  const size_t nblocks = QuantBlockCount(n, block);
  for (size_t b = blockIdx.x; b < nblocks; b += gridDim.x) {
    const size_t begin = b * block;
    const size_t end = begin + block < n ? begin + block : n;
    uint32_t m = QuantMaxThread<F32>(x, begin, end, threadIdx.x, blockDim.x);
    for (int off = 16; off > 0; off >>= 1) {
      const uint32_t o = __shfl_xor_sync(0xFFFFFFFFu, m, off);
      m = o > m ? o : m;
    }
    if ((threadIdx.x & 31u) == 0) warp_max[threadIdx.x / 32] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (unsigned w = 0; w < blockDim.x / 32; ++w) m = warp_max[w] > m ? warp_max[w] : m;
      const QuantScale s = Int4ScaleOfBits(m);
      scales[b] = s.scale;
      inv[b] = s.inv;
    }
    __syncthreads();  // warp_max is read before the next block's partials overwrite it
  }
}

__global__ void __launch_bounds__(kThreads)
    Int4CodesKernel(const float* x, size_t n, size_t block, const float* inv, uint8_t* q) {
  Int4CodesThread(x, n, block, inv, q, static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x,
                  static_cast<size_t>(gridDim.x) * blockDim.x);
}

__global__ void __launch_bounds__(kThreads)
    DequantizeInt4Kernel(const uint8_t* q, const float* scales, size_t n, size_t block, float* out) {
  DequantizeInt4Thread(q, scales, n, block, out, static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x,
                       static_cast<size_t>(gridDim.x) * blockDim.x);
}

__global__ void __launch_bounds__(kThreads)
    LocoResidualKernel(const float* y, const float* sent, float* e, float beta, float keep, size_t n) {
  LocoResidualThread(y, sent, e, beta, keep, n, static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x,
                     static_cast<size_t>(gridDim.x) * blockDim.x);
}

__global__ void __launch_bounds__(kThreads) DivideKernel(const float* src, float* dst, float divisor, size_t n) {
  DivideThread(src, dst, divisor, n, static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x,
               static_cast<size_t>(gridDim.x) * blockDim.x);
}

}  // namespace

cudaError_t LaunchQuantizeInt4(const float* d_x, size_t n, size_t block, uint8_t* d_q, float* d_scales, float* d_inv,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (block == 0) return cudaErrorInvalidValue;
  Int4ScalesKernel<<<QuantGridBlocks(n, block), QuantThreads(block), 0, stream>>>(d_x, n, block, d_scales, d_inv);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  unsigned blocks = 0;
  if (cudaError_t e = GridStrideBlocks(reinterpret_cast<const void*>(&Int4CodesKernel), (n + 1) / 2, &blocks);
      e != cudaSuccess) {
    return e;
  }
  Int4CodesKernel<<<blocks, kThreads, 0, stream>>>(d_x, n, block, d_inv, d_q);
  return cudaGetLastError();
}

cudaError_t LaunchDequantizeInt4(const uint8_t* d_q, const float* d_scales, size_t n, size_t block, float* d_out,
                                 cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (block == 0) return cudaErrorInvalidValue;
  unsigned blocks = 0;
  if (cudaError_t e = GridStrideBlocks(reinterpret_cast<const void*>(&DequantizeInt4Kernel), n, &blocks);
      e != cudaSuccess) {
    return e;
  }
  DequantizeInt4Kernel<<<blocks, kThreads, 0, stream>>>(d_q, d_scales, n, block, d_out);
  return cudaGetLastError();
}

cudaError_t LaunchLocoResidual(const float* d_y, const float* d_sent, float* d_e, float beta, size_t n,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  unsigned blocks = 0;
  if (cudaError_t e = GridStrideBlocks(reinterpret_cast<const void*>(&LocoResidualKernel), n, &blocks);
      e != cudaSuccess) {
    return e;
  }
  // keep = 1 − β once, on the host, as the reference computes it (one rounded f32 subtraction either way).
  LocoResidualKernel<<<blocks, kThreads, 0, stream>>>(d_y, d_sent, d_e, beta, 1.0f - beta, n);
  return cudaGetLastError();
}

cudaError_t LaunchDivide(const float* d_src, float* d_dst, float divisor, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  unsigned blocks = 0;
  if (cudaError_t e = GridStrideBlocks(reinterpret_cast<const void*>(&DivideKernel), n, &blocks); e != cudaSuccess)
    return e;
  DivideKernel<<<blocks, kThreads, 0, stream>>>(d_src, d_dst, divisor, n);
  return cudaGetLastError();
}

}  // namespace zero::cuda::internal
