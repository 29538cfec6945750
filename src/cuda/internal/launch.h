// Host-side launchers of zero's CUDA kernels, returning cudaError_t (absl-free).
//
// The public, Status-returning API is zero/advanced/cuda_kernels.h (implemented in src/cuda/kernels.cc on top of
// these). This layer exists so the kernels build and link with nothing but the CUDA toolkit: the GPU
// benchmark compiles standalone on a machine without zero's other dependencies (bench/gpu/check.sh).
// Every launcher is stream-ordered (enqueues on `stream`, never blocks the host) and returns the launch
// error, if any (cudaGetLastError right after the launch).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cuda/internal/batch_copy.cuh"
#include "cuda/internal/device_math.cuh"
#include "cuda/internal/fused_optim.cuh"
#include "cuda/internal/grad_stats.cuh"
#include "cuda/internal/qgz.cuh"
#include "cuda/internal/quantize.cuh"

namespace zero::cuda::internal {

// Parameter write-back type: the element types plus "none".
enum class OutDt : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kNone = 3 };

// Threads per block of the element-wise kernels.
constexpr int kThreads = 256;

// The vector plan for a fused step over `a`'s buffers (master, grad, states, param_out) of n elements.
VecPlan MakeFusedPlan(const FusedArgs& a, Dt grad_dt, OutDt out_dt, int states, size_t n);

// One fused optimizer step over a.plan.n elements. a.plan must come from MakeFusedPlan.
cudaError_t LaunchAdam(const FusedArgs& a, Dt grad_dt, OutDt out_dt, const AdamOp& op, cudaStream_t stream);
cudaError_t LaunchSgd(const FusedArgs& a, Dt grad_dt, OutDt out_dt, const SgdOp<0>& op, cudaStream_t stream);
cudaError_t LaunchSgd(const FusedArgs& a, Dt grad_dt, OutDt out_dt, const SgdOp<1>& op, cudaStream_t stream);

// GradStats: the result written (or added, when `accumulate`) to *d_out on the device.
struct StatsResult {
  double sumsq;
  unsigned long long nonfinite;
};
// At most this many blocks in the first pass; the grid depends only on n and the buffer's alignment, never on
// the device or on timing, so the reduction order (and the result's bits) is fixed.
constexpr int kStatsMaxBlocks = 1024;
constexpr size_t kStatsWorkspaceBytes = kStatsMaxBlocks * (sizeof(double) + sizeof(unsigned long long));
cudaError_t LaunchGradStats(const void* d_grad, Dt dt, size_t n, float scale, StatsResult* d_out, bool accumulate,
                            void* d_workspace, cudaStream_t stream);

// Copies up to kCopySegmentsPerLaunch segments in one launch (empty segments allowed).
struct CopySeg {
  const void* src;
  void* dst;
  size_t bytes;
};
cudaError_t LaunchBatchCopy(const CopySeg* segs, int count, cudaStream_t stream);

// Element-wise conversion between f32, f16 and bf16 (src and dst types differ).
cudaError_t LaunchConvert(const void* d_src, Dt st, void* d_dst, Dt dt, size_t n, cudaStream_t stream);

// d_dst[i] = dt(d_dst[i] + d_src[i]) in f32 (any pair of types).
cudaError_t LaunchAdd(const void* d_src, Dt st, void* d_dst, Dt dt, size_t n, cudaStream_t stream);

// Stochastic rounding of fp32 to bf16 (the host's StochasticRoundToBF16 bit for bit).
cudaError_t LaunchStochasticRound(const float* d_src, uint16_t* d_dst, size_t n, uint64_t key, int64_t first_index,
                                  cudaStream_t stream);

// Blockwise int8 quantization (cuda/internal/quantize.cuh; the host's QuantizeInt8Scalar / DequantizeInt8Scalar
// bit for bit): d_q gets n codes, d_scales QuantBlockCount(n, block) scales. block >= 1 (else
// cudaErrorInvalidValue).
cudaError_t LaunchQuantizeInt8(const void* d_x, Dt dt, size_t n, size_t block, int8_t* d_q, float* d_scales,
                               cudaStream_t stream);
cudaError_t LaunchDequantizeInt8(const int8_t* d_q, const float* d_scales, size_t n, size_t block, void* d_out, Dt dt,
                                 cudaStream_t stream);
// Their launch shape, shared with the emulation test: one CUDA block per quantization block, up to
// kQuantMaxGrid blocks (beyond, each loops over blocks); threads = the block size rounded up to a whole warp, at
// most the shape's max_threads, so small blocks do not leave most of a CUDA block idle (the max reduction needs
// whole warps); each thread keeps up to `cached` vectors in registers (quantize.cuh's C).
struct QuantShape {
  unsigned max_threads;  // a multiple of 32 in [32, kThreads]
  unsigned cached;       // 4 or 8
};
// Production: f32 on 256 threads × 4 cached vectors; 16-bit types on 64 threads × 8, so that a 4096-element block
// gives each thread 8 vectors (128 bytes) in flight rather than 2 (measured on one H200 call against 256 × 4 and
// 128 × 4: quantize bf16 0.988 / 0.626 / 0.905 of the copy, dequantize -> bf16 0.934 / 0.778 / 0.918;
// bench/results/gpu-2026-12-04.md, evening). f32 stays: 128 × 4 and 64 × 8 measured slower for it.
constexpr QuantShape kQuantShapeF32 = {static_cast<unsigned>(kThreads), 4};
constexpr QuantShape kQuantShape16 = {64, 8};
constexpr QuantShape QuantShapeOf(Dt dt) { return dt == Dt::kF32 ? kQuantShapeF32 : kQuantShape16; }
constexpr bool QuantShapeValid(QuantShape s) {
  return s.max_threads >= 32 && s.max_threads <= static_cast<unsigned>(kThreads) && s.max_threads % 32 == 0 &&
         (s.cached == 4 || s.cached == 8);
}
constexpr size_t kQuantMaxGrid = size_t{1} << 20;
inline unsigned QuantGridBlocks(size_t n, size_t block) {
  const size_t b = QuantBlockCount(n, block);
  return static_cast<unsigned>(b < kQuantMaxGrid ? b : kQuantMaxGrid);
}
inline unsigned QuantThreads(size_t block, unsigned max_threads = static_cast<unsigned>(kThreads)) {
  const size_t warps = (block + 31) / 32;
  const size_t t = 32 * warps;
  return static_cast<unsigned>(t < static_cast<size_t>(max_threads) ? t : static_cast<size_t>(max_threads));
}
// The same kernels on a given shape (the bench's and the tests' alternatives; LaunchQuantizeInt8 /
// LaunchDequantizeInt8 are these with QuantShapeOf(dt)). cudaErrorInvalidValue unless QuantShapeValid.
cudaError_t LaunchQuantizeInt8Shaped(const void* d_x, Dt dt, size_t n, size_t block, QuantShape shape, int8_t* d_q,
                                     float* d_scales, cudaStream_t stream);
cudaError_t LaunchDequantizeInt8Shaped(const int8_t* d_q, const float* d_scales, size_t n, size_t block,
                                       QuantShape shape, void* d_out, Dt dt, cudaStream_t stream);

// ZeRO++ qgZ's element kernels (cuda/internal/qgz.cuh; the host tier's references bit for bit). Int4: d_q gets
// (n + 1) / 2 bytes, d_scales QuantBlockCount(n, block) scales, d_inv as many floats of scratch (the factors the
// second pass reads). LocoResidual: d_e[i] = β·d_e[i] + (1 − β)·(d_y[i] − d_sent[i]), 0 where not finite. Divide:
// d_dst[i] = d_src[i] / divisor (d_dst may be d_src). block >= 1 (else cudaErrorInvalidValue).
cudaError_t LaunchQuantizeInt4(const float* d_x, size_t n, size_t block, uint8_t* d_q, float* d_scales, float* d_inv,
                               cudaStream_t stream);
cudaError_t LaunchDequantizeInt4(const uint8_t* d_q, const float* d_scales, size_t n, size_t block, float* d_out,
                                 cudaStream_t stream);
cudaError_t LaunchLocoResidual(const float* d_y, const float* d_sent, float* d_e, float beta, size_t n,
                               cudaStream_t stream);
cudaError_t LaunchDivide(const float* d_src, float* d_dst, float divisor, size_t n, cudaStream_t stream);

// Sets *blocks to the resident blocks of `threads` threads for `kernel` per SM of the current device, times
// its SM count (cached per kernel and device). Grid-stride kernels launch exactly one full wave.
cudaError_t FullWaveBlocks(const void* kernel, int threads, int* blocks);
// The blocks of kThreads threads a grid-stride `kernel` is launched with for `work` thread-items: one per kThreads
// items, at most one full wave (the kernel loops over the rest), at least one.
cudaError_t GridStrideBlocks(const void* kernel, size_t work, unsigned* blocks);

}  // namespace zero::cuda::internal
