// Fused optimizer kernels (AdamW / Adam-L2 / SGD) on flat fp32 shards. The per-element work is Op::Apply
// (cuda/internal/fused_optim.cuh); this file instantiates the production variant of the tiled step
// (FusedProductionVariant: 16 elements per thread per iteration as four warp-contiguous 16-byte f32 accesses per
// buffer, all loads before any math, evict-first hints) for every gradient type x write-back type, and launches
// one block per tile. zero-bench-gpu times it against the other variants and against the first version
// (cuda/internal/fused_kernel.cuh).
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>

#include "cuda/internal/fused_kernel.cuh"
#include "cuda/internal/launch.h"

namespace zero::cuda::internal {

namespace {

// The production launch: FusedProductionVariant, one tile per block. On the 2026-11-30 H200 run of
// zero-bench-gpu's sweep (bench/results/gpu-2026-11-30.md) it moved 0.96-0.98 of the copy bandwidth in the three
// AdamW configurations; the first version (LaunchFusedV1, kept for the sweep) moved 0.81-0.84, the same
// variant on a full wave of looping blocks 0.90-0.92. Every variant gives identical bits (tests/cuda).
template <class G, class P, class Op>
cudaError_t LaunchTyped(const FusedArgs& a, const Op& op, cudaStream_t stream) {
  return LaunchFusedTiled<G, P, Op, FusedProductionVariant>(
      a, op, kProductionOnePass ? FusedGrid::kOnePass : FusedGrid::kFullWave, stream);
}

template <class G, class Op>
cudaError_t DispatchOut(const FusedArgs& a, OutDt out_dt, const Op& op, cudaStream_t stream) {
  switch (out_dt) {
    case OutDt::kF32: return LaunchTyped<G, F32>(a, op, stream);
    case OutDt::kF16: return LaunchTyped<G, F16>(a, op, stream);
    case OutDt::kBF16: return LaunchTyped<G, BF16>(a, op, stream);
    case OutDt::kNone: return LaunchTyped<G, NoOut>(a, op, stream);
  }
  return cudaErrorInvalidValue;
}

template <class Op>
cudaError_t Dispatch(const FusedArgs& a, Dt grad_dt, OutDt out_dt, const Op& op, cudaStream_t stream) {
  switch (grad_dt) {
    case Dt::kF32: return DispatchOut<F32>(a, out_dt, op, stream);
    case Dt::kF16: return DispatchOut<F16>(a, out_dt, op, stream);
    case Dt::kBF16: return DispatchOut<BF16>(a, out_dt, op, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t FullWaveBlocks(const void* kernel, int threads, int* blocks) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> cache;  // (kernel, device) -> blocks
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find({kernel, device});
    if (it != cache.end()) {
      *blocks = it->second;
      return cudaSuccess;
    }
  }
  int sms = 0;
  int per_sm = 0;
  if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); e != cudaSuccess) {
    return e;
  }
  if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0); e != cudaSuccess) {
    return e;
  }
  *blocks = sms * (per_sm > 0 ? per_sm : 1);
  std::lock_guard<std::mutex> lock(mu);
  cache[{kernel, device}] = *blocks;
  return cudaSuccess;
}

cudaError_t GridStrideBlocks(const void* kernel, size_t work, unsigned* blocks) {
  int wave = 0;
  if (cudaError_t e = FullWaveBlocks(kernel, kThreads, &wave); e != cudaSuccess) return e;
  size_t b = (work + kThreads - 1) / kThreads;
  if (b > static_cast<size_t>(wave)) b = static_cast<size_t>(wave);
  *blocks = static_cast<unsigned>(b > 0 ? b : 1);
  return cudaSuccess;
}

VecPlan MakeFusedPlan(const FusedArgs& a, Dt grad_dt, OutDt out_dt, int states, size_t n) {
  const PlanBuffer bufs[5] = {
      {a.master, 4},
      {a.grad, DtSize(grad_dt)},
      {states >= 1 ? a.state[0] : nullptr, 4},
      {states >= 2 ? a.state[1] : nullptr, 4},
      {out_dt == OutDt::kNone ? nullptr : a.param_out, out_dt == OutDt::kF32 ? size_t{4} : size_t{2}},
  };
  return MakeVecPlan(bufs, 5, n);
}

cudaError_t LaunchAdam(const FusedArgs& a, Dt grad_dt, OutDt out_dt, const AdamOp& op, cudaStream_t stream) {
  return Dispatch(a, grad_dt, out_dt, op, stream);
}

cudaError_t LaunchSgd(const FusedArgs& a, Dt grad_dt, OutDt out_dt, const SgdOp<0>& op, cudaStream_t stream) {
  return Dispatch(a, grad_dt, out_dt, op, stream);
}

cudaError_t LaunchSgd(const FusedArgs& a, Dt grad_dt, OutDt out_dt, const SgdOp<1>& op, cudaStream_t stream) {
  return Dispatch(a, grad_dt, out_dt, op, stream);
}

}  // namespace zero::cuda::internal
