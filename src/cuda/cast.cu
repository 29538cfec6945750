// Element-wise kernels between f32, f16 and bf16 on the device: casts, the add-into of a reduced gradient, and
// stochastic rounding. The bit manipulation is that of zero/dtype.h (shared through
// cuda/internal/device_math.cuh), so device and host agree bit for bit (tests/cuda/cast_test.cc,
// tests/cuda/emulation_test.cc).
#include <cuda_runtime.h>

#include "cuda/internal/convert.cuh"
#include "cuda/internal/launch.h"

namespace zero::cuda::internal {

namespace {

// What a (src, dst) kernel does per thread: dst = src (cast), or dst = dst + src (add).
enum class PairOp { kConvert, kAdd };

template <PairOp kOp, class S, class D>
__global__ void __launch_bounds__(kThreads) PairKernel(const void* src, void* dst, VecPlan plan) {
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t nthreads = static_cast<size_t>(gridDim.x) * blockDim.x;
  if constexpr (kOp == PairOp::kConvert) {
    ConvertThread<S, D>(src, dst, plan, tid, nthreads);
  } else {
    AddThread<S, D>(src, dst, plan, tid, nthreads);
  }
}

__global__ void __launch_bounds__(kThreads)
    StochasticRoundKernel(const float* src, uint16_t* dst, size_t n, uint64_t mixed_key, int64_t first_index) {
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t nthreads = static_cast<size_t>(gridDim.x) * blockDim.x;
  StochasticRoundThread(src, dst, n, mixed_key, first_index, tid, nthreads);
}

template <PairOp kOp, class S, class D>
cudaError_t LaunchTyped(const void* src, void* dst, size_t n, cudaStream_t stream) {
  const PlanBuffer bufs[2] = {{src, sizeof(typename S::Elem)}, {dst, sizeof(typename D::Elem)}};
  const VecPlan plan = MakeVecPlan(bufs, 2, n);
  const size_t work = plan.nvec > plan.ScalarCount() ? plan.nvec : plan.ScalarCount();
  if (work == 0) return cudaSuccess;
  unsigned blocks = 0;
  if (cudaError_t e = GridStrideBlocks(reinterpret_cast<const void*>(&PairKernel<kOp, S, D>), work, &blocks);
      e != cudaSuccess) {
    return e;
  }
  PairKernel<kOp, S, D><<<blocks, kThreads, 0, stream>>>(src, dst, plan);
  return cudaGetLastError();
}

template <PairOp kOp, class S>
cudaError_t DispatchDst(const void* src, void* dst, Dt dt, size_t n, cudaStream_t stream) {
  switch (dt) {
    case Dt::kF32: return LaunchTyped<kOp, S, F32>(src, dst, n, stream);
    case Dt::kF16: return LaunchTyped<kOp, S, F16>(src, dst, n, stream);
    case Dt::kBF16: return LaunchTyped<kOp, S, BF16>(src, dst, n, stream);
  }
  return cudaErrorInvalidValue;
}

template <PairOp kOp>
cudaError_t Dispatch(const void* src, Dt st, void* dst, Dt dt, size_t n, cudaStream_t stream) {
  switch (st) {
    case Dt::kF32: return DispatchDst<kOp, F32>(src, dst, dt, n, stream);
    case Dt::kF16: return DispatchDst<kOp, F16>(src, dst, dt, n, stream);
    case Dt::kBF16: return DispatchDst<kOp, BF16>(src, dst, dt, n, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t LaunchConvert(const void* d_src, Dt st, void* d_dst, Dt dt, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (st == dt) return cudaMemcpyAsync(d_dst, d_src, n * DtSize(st), cudaMemcpyDeviceToDevice, stream);
  return Dispatch<PairOp::kConvert>(d_src, st, d_dst, dt, n, stream);
}

cudaError_t LaunchAdd(const void* d_src, Dt st, void* d_dst, Dt dt, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return Dispatch<PairOp::kAdd>(d_src, st, d_dst, dt, n, stream);
}

cudaError_t LaunchStochasticRound(const float* d_src, uint16_t* d_dst, size_t n, uint64_t key, int64_t first_index,
                                  cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  unsigned blocks = 0;
  if (cudaError_t e = GridStrideBlocks(reinterpret_cast<const void*>(&StochasticRoundKernel), n, &blocks);
      e != cudaSuccess) {
    return e;
  }
  StochasticRoundKernel<<<blocks, kThreads, 0, stream>>>(d_src, d_dst, n, SplitMix(key), first_index);
  return cudaGetLastError();
}

}  // namespace zero::cuda::internal
